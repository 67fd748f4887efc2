"""test_f32_matmul.py: f32 as bf16 products (docs/semantics.md, section 5) from Python.

The per-call keyword f32_matmul of flash_attn_func, the varlen form and
flash_attn_with_kvcache, and the torch layer's default: with no keyword, f32 torch
tensors follow torch.get_float32_matmul_precision() ("high" bf16x3, "medium" bf16,
"highest" the context's setting, ieee here), on the flash-attn functions and the SDPA
route alike; an explicit keyword wins over the precision; other dtypes ignore it; bad
values are a ValueError. Accuracy is tests/test_f32_matmul.c's.
"""

import pytest

from conftest import needs_torch, randn, torch

pytestmark = needs_torch

if torch is not None:
    import torch.nn.functional as F

    import flashattn
    from flashattn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

MODES = ("ieee", "bf16x3", "bf16")
PRECISION = {"highest": "ieee", "high": "bf16x3", "medium": "bf16"}
# the paths with bf16 dot products, where the modes give different results
APPLIES = ("avx512bf16", "amx", "amx-model")


@pytest.fixture
def precision():
    """Sets torch's f32 matmul precision for one test and restores it."""
    old = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(old)


def _qkv(B=1, S=200, Hq=4, Hk=2, D=64, seed=0, dtype=None):
    q, k, v = (randn(B, S, h, D, seed=seed + i) for i, h in enumerate((Hq, Hk, Hk)))
    return (q, k, v) if dtype is None else (q.to(dtype), k.to(dtype), v.to(dtype))


def _modes_differ(want):
    if flashattn.Context(threads=1).isa in APPLIES:
        assert not torch.equal(want["ieee"], want["bf16x3"]) and not torch.equal(want["bf16x3"], want["bf16"])


def test_func_follows_torch_precision_and_keyword_wins(precision):
    q, k, v = _qkv()
    with flashattn.Context(threads=2):
        precision("highest")
        want = {m: flash_attn_func(q, k, v, causal=True, f32_matmul=m) for m in MODES}
        _modes_differ(want)
        for i, m in enumerate(MODES):
            assert torch.equal(flash_attn_func(q, k, v, causal=True, f32_matmul=i), want[m])
        for p, m in PRECISION.items():
            precision(p)
            assert torch.equal(flash_attn_func(q, k, v, causal=True), want[m]), p
            for m2 in MODES:  # the keyword wins
                assert torch.equal(flash_attn_func(q, k, v, causal=True, f32_matmul=m2), want[m2]), (p, m2)


def test_func_with_grad_follows_precision(precision):
    """The autograd path (forward with lse) takes the mode too; the backward is ieee."""
    q, k, v = _qkv(seed=5)
    with flashattn.Context(threads=2):
        want = flash_attn_func(q, k, v, f32_matmul="bf16x3")
        precision("high")
        qg = q.clone().requires_grad_()
        out = flash_attn_func(qg, k, v)
        assert torch.equal(out.detach(), want)
        out.sum().backward()
        assert qg.grad is not None and torch.isfinite(qg.grad).all()


def test_sdpa_route_follows_precision(precision):
    q, k, v = _qkv(Hq=4, Hk=4, seed=10)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # (N, H, L, E) views
    with flashattn.Context(threads=2):
        want = {m: flash_attn_func(q, k, v, f32_matmul=m) for m in MODES}
        _modes_differ(want)
        for p, m in PRECISION.items():
            precision(p)
            with flashattn.torch.sdpa():
                out = F.scaled_dot_product_attention(qt, kt, vt)
            assert torch.equal(out.transpose(1, 2), want[m]), p


def test_varlen_and_kvcache_keyword(precision):
    q, k, v = _qkv(S=150, seed=20)
    cu = torch.tensor([0, 150], dtype=torch.int32)
    with flashattn.Context(threads=2):
        want = {m: flash_attn_func(q, k, v, causal=True, f32_matmul=m) for m in MODES}
        for p, m in PRECISION.items():
            precision(p)
            out = flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 150, 150, causal=True)
            assert torch.equal(out, want[m][0]), p
            for m2 in MODES:
                out = flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 150, 150, causal=True, f32_matmul=m2)
                assert torch.equal(out, want[m2][0]), (p, m2)
        precision("highest")
        # a cache holding the keys, the whole prompt as one prefill
        seqlens = torch.tensor([150], dtype=torch.int32)
        for m in MODES:
            out = flash_attn_with_kvcache(q, k.clone(), v.clone(), cache_seqlens=seqlens, causal=True, f32_matmul=m)
            assert torch.equal(out, want[m]), m
        precision("high")
        out = flash_attn_with_kvcache(q, k.clone(), v.clone(), cache_seqlens=seqlens, causal=True)
        assert torch.equal(out, want["bf16x3"])


def test_other_dtypes_ignore_precision(precision):
    q, k, v = _qkv(dtype=torch.bfloat16, seed=30)
    with flashattn.Context(threads=2):
        precision("highest")
        want = flash_attn_func(q, k, v)
        precision("medium")
        assert torch.equal(flash_attn_func(q, k, v), want)


def test_bad_values():
    q, k, v = _qkv(S=20)
    with pytest.raises(ValueError, match="f32_matmul"):
        flash_attn_func(q, k, v, f32_matmul="fast")
    with pytest.raises(ValueError, match="f32_matmul"):
        flash_attn_func(q, k, v, f32_matmul=3)
