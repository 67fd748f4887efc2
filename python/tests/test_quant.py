"""test_quant.py: the int8 products (docs/semantics.md, section 11) from Python.

The per-call keyword quant_matmul of flash_attn_func, the varlen forms and
flash_attn_with_kvcache, and Context.quant_matmul (the context's setting, the route
for torch's SDPA): a call's value v gives the bits of the same call on a context set
to v, whatever the context's setting; bad values are a ValueError; the backward of a
call whose mode is not exact is refused. Accuracy is tests/test_quant.c's.
"""

import pytest

from conftest import needs_torch, randn, torch

pytestmark = needs_torch

if torch is not None:
    import torch.nn.functional as F

    import flashattn
    from flashattn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

MODES = ("exact", "i8", "i8x2")
# the paths whose kernel tables have the int8 decode kernels (tests/test_quant.c's list)
APPLIES = ("ref", "avx2vnni", "avx512bf16", "amx", "amx-model")


def _int8_cache(B, L, Hk, D, seed):
    x = randn(B, L, Hk, D, seed=seed)
    scale = x.abs().amax(-1) / 127.0
    codes = torch.clamp(torch.round(x / scale[..., None]), -127, 127).to(torch.int8)
    return codes, scale


def _per_call_is_the_setting(call):
    ctx = flashattn.Context(threads=2)
    with ctx:
        want = {}
        for m in MODES:
            ctx.quant_matmul = m
            assert ctx.quant_matmul == m
            want[m] = call(None)
        for setting in MODES:
            ctx.quant_matmul = setting
            for m in MODES:
                assert torch.equal(call(m), want[m]), (m, setting)
                assert torch.equal(call(MODES.index(m)), want[m]), (m, setting)
            assert ctx.quant_matmul == setting
        ctx.quant_matmul = "exact"
    return ctx, want


@pytest.mark.parametrize("lse", [False, True])  # the per-call path and the general one
def test_kvcache_keyword_is_the_contexts_setting_bitwise(lse):
    B, L, Hq, Hk, D = 2, 600, 8, 2, 64
    q = randn(B, 1, Hq, D, seed=1)
    kc, ks = _int8_cache(B, L, Hk, D, 2)
    vc, vs = _int8_cache(B, L, Hk, D, 3)
    seqlens = torch.full((B,), L, dtype=torch.int32)

    def call(mode):
        # no append: a lean int8 call passes its scales, so take the general path for both
        out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, k_scale=ks, v_scale=vs,
                                      return_softmax_lse=lse, quant_matmul=mode)
        return out[0] if lse else out

    ctx, want = _per_call_is_the_setting(call)
    if ctx.isa in APPLIES:
        assert not torch.equal(want["i8"], want["exact"]) and not torch.equal(want["i8x2"], want["exact"])
        ref = want["exact"]
        assert (want["i8x2"] - ref).abs().max() <= 2.5e-4 * ref.abs().max()
        assert (want["i8"] - ref).abs().max() <= 4e-2 * ref.abs().max()


def test_dense_and_varlen_keyword_is_the_contexts_setting_bitwise():
    q, k, v = randn(1, 80, 4, 64, seed=4), randn(1, 96, 2, 64, seed=5), randn(1, 96, 2, 64, seed=6)
    _per_call_is_the_setting(lambda m: flash_attn_func(q, k, v, causal=True, quant_matmul=m))
    _per_call_is_the_setting(lambda m: torch.from_numpy(flash_attn_func(q.numpy(), k.numpy(), v.numpy(),
                                                                        quant_matmul=m)))
    cu_q = torch.tensor([0, 30, 80], dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 96], dtype=torch.int32)
    _per_call_is_the_setting(lambda m: flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 50, 56, causal=True,
                                                              quant_matmul=m))


def test_sdpa_takes_the_contexts_setting():
    import flashattn.torch as fat

    q, k, v = randn(1, 4, 70, 64, seed=7), randn(1, 4, 90, 64, seed=8), randn(1, 4, 90, 64, seed=9)
    ctx = flashattn.Context(threads=2)
    with ctx:
        for m in MODES:
            ctx.quant_matmul = m
            got = fat.scaled_dot_product_attention(q, k, v)
            ctx.quant_matmul = "exact"
            want = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), quant_matmul=m)
            assert torch.equal(got, want.transpose(1, 2)), m


def test_bad_values_and_the_backward():
    q = randn(1, 16, 2, 32, seed=10)
    for bad in ("int4", "I8"):
        with pytest.raises(ValueError, match="quant_matmul"):
            flash_attn_func(q, q, q, quant_matmul=bad)
    for bad in (3, -2):
        with pytest.raises(ValueError, match="quant_matmul"):
            flash_attn_func(q, q, q, quant_matmul=bad)
    with pytest.raises(ValueError, match="quant_matmul"):
        flashattn.Context(threads=1).quant_matmul = "fp4"
    for m in ("i8", "i8x2"):
        qs = q.clone().requires_grad_()
        out = flash_attn_func(qs, q, q, quant_matmul=m)
        with pytest.raises((ValueError, RuntimeError, NotImplementedError), match="exact"):
            out.sum().backward()
    ctx = flashattn.Context(threads=1)
    with ctx:
        ctx.quant_matmul = "i8"  # a per-call exact trains on an i8 context
        qs = q.clone().requires_grad_()
        flash_attn_func(qs, q, q, quant_matmul="exact").sum().backward()
        assert qs.grad is not None and torch.isfinite(qs.grad).all()
