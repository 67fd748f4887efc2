"""test_flex.py: flashattn.flex_attention against torch's own FlexAttention and the oracle.

The cases follow torch's test/inductor/test_flex_attention.py (its masks built with
create_block_mask: causal, sliding window, prefix-LM, document masks, random
element masks, per-head and per-batch masks; GQA; return_lse; fully masked rows;
lengths that are not multiples of the block size; several block sizes). The
references are torch's eager flex_attention (unfused; forward only: torch has no
FlexAttention backward on CPU) and conftest's fp64 oracle with the dense mask of
create_mask (forward and gradients), judged by the accuracy rule.
"""

import math

import pytest

from conftest import assert_rule, attn_ref, needs_torch, randn, torch

pytestmark = needs_torch
fa = pytest.importorskip("torch.nn.attention.flex_attention", reason="torch without flex_attention")

import flashattn  # noqa: E402
from flashattn import score_mods  # noqa: E402

create_block_mask, create_mask = fa.create_block_mask, fa.create_mask


def torch_flex(*args, **kw):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "called without torch.compile": the unfused reference is what we want
        return fa.flex_attention(*args, **kw)


# ---------------------------------------------------------------- masks (mask_mods)
def causal(b, h, q, kv):
    return q >= kv


def sliding(w):
    def mod(b, h, q, kv):
        return (q >= kv) & (q - kv <= w)

    return mod


def prefix_lm(n):
    def mod(b, h, q, kv):
        return (kv < n) | (q >= kv)

    return mod


def document(lengths):
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))

    def mod(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    return mod


def random_elements(Sq, Sk, density, seed=0):
    keep = torch.rand(Sq, Sk, generator=torch.Generator().manual_seed(seed)) < density

    def mod(b, h, q, kv):
        return keep[q, kv]

    return mod


def per_head(b, h, q, kv):  # even heads causal, odd heads a window of 40 both sides
    return torch.where(h % 2 == 0, q >= kv, (q - kv).abs() <= 40)


def per_batch(b, h, q, kv):  # batch row b keeps kv <= q + 17 * b
    return kv <= q + 17 * b


def empty_rows(b, h, q, kv):  # every 7th row keeps nothing, the others causal
    return (q % 7 != 0) & (q >= kv)


MASKS = {
    "causal": (causal, False, False),
    "sliding": (sliding(50), False, False),
    "prefix_lm": (prefix_lm(70), False, False),
    "document": (document([40, 97, 3, 60, 100]), False, False),
    "random": (random_elements(300, 300, 0.3), False, False),
    "per_head": (per_head, False, True),
    "per_batch": (per_batch, True, False),
    "empty_rows": (empty_rows, False, False),
}


def _qkv(B, Hq, Hk, Sq, Sk, D, dtype, seed=0, grad=False):
    q = randn(B, Hq, Sq, D, dtype=dtype, seed=seed)
    k = randn(B, Hk, Sk, D, dtype=dtype, seed=seed + 1)
    v = randn(B, Hk, Sk, D, dtype=dtype, seed=seed + 2)
    for x in (q, k, v):
        x.requires_grad_(grad)
    return q, k, v


def _dense(mask_mod, B, H, Sq, Sk):
    return create_mask(mask_mod, B, H, Sq, Sk, device="cpu")


def _oracle(q, k, v, dense, dtype=torch.float64, **kw):
    """attn_ref in BHSD: (out (B, H, Sq, Dv), lse (B, H, Sq))."""
    o, lse = attn_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask=dense, dtype=dtype, **kw)
    return o.transpose(1, 2), lse


@pytest.mark.parametrize("name", sorted(MASKS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_matches_torch_and_oracle(name, dtype):
    mod, per_b, per_h = MASKS[name]
    B, H, S, D = 2, 4, 300, 64
    bm = create_block_mask(mod, B if per_b else None, H if per_h else None, S, S, device="cpu")
    q, k, v = _qkv(B, H, H, S, S, D, dtype)
    out, lse = flashattn.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    assert out.shape == (B, H, S, D) and out.dtype == dtype and lse.shape == (B, H, S)
    dense = _dense(mod, B if per_b else 1, H if per_h else 1, S, S)
    ref, ref_lse = _oracle(q, k, v, dense)
    naive, _ = _oracle(q, k, v, dense, dtype=dtype)
    assert_rule(out, ref, naive)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[finite].double() - ref_lse[finite]).abs().max() < 1e-3 * (1 if dtype == torch.float32 else 30)
    # torch's own flex_attention (unfused eager) on the same BlockMask
    t_out, t_lse = torch_flex(q, k, v, block_mask=bm, return_lse=True)
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    assert (out.double() - t_out.double()).abs().max() < tol
    assert torch.equal(torch.isfinite(t_lse), finite)
    assert (lse[finite] - t_lse[finite]).abs().max() < tol * 10


def test_empty_rows_are_zero_with_minus_inf_lse():
    B, H, S, D = 1, 2, 200, 32
    bm = create_block_mask(empty_rows, None, None, S, S, device="cpu")
    q, k, v = _qkv(B, H, H, S, S, D, torch.float32, grad=True)
    out, lse = flashattn.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    rows = torch.arange(S) % 7 == 0
    assert torch.equal(out[:, :, rows], torch.zeros_like(out[:, :, rows]))
    assert torch.isneginf(lse[:, :, rows]).all() and torch.isfinite(lse[:, :, ~rows]).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.equal(q.grad[:, :, rows], torch.zeros_like(q.grad[:, :, rows]))


@pytest.mark.parametrize("name", ["causal", "document", "random", "per_head", "empty_rows", "prefix_lm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_match_oracle(name, dtype):
    mod, per_b, per_h = MASKS[name]
    B, H, S, D = 2, 4, 300, 32
    bm = create_block_mask(mod, B if per_b else None, H if per_h else None, S, S, device="cpu")
    q, k, v = _qkv(B, H, H, S, S, D, dtype, seed=5, grad=True)
    dout = randn(B, H, S, D, dtype=dtype, seed=9)
    out = flashattn.flex_attention(q, k, v, block_mask=bm)
    got = torch.autograd.grad(out, (q, k, v), dout)
    dense = _dense(mod, B if per_b else 1, H if per_h else 1, S, S)
    ref = torch.autograd.grad(_oracle(q, k, v, dense)[0], (q, k, v), dout)
    naive = torch.autograd.grad(_oracle(q, k, v, dense, dtype=dtype)[0], (q, k, v), dout)
    for g, r, n, what in zip(got, ref, naive, ("dq", "dk", "dv")):
        assert_rule(g, r, n, ulps=16, what=what)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gqa(dtype):
    B, Hq, Hk, S, D = 1, 8, 2, 257, 64
    bm = create_block_mask(sliding(60), None, None, S, S, device="cpu")
    q, k, v = _qkv(B, Hq, Hk, S, S, D, dtype, seed=3, grad=True)
    out = flashattn.flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
    dense = _dense(sliding(60), 1, 1, S, S)
    # the oracle takes Hk < Hq itself (repeat_interleave), as the library does
    ref, _ = _oracle(q, k, v, dense)
    naive, _ = _oracle(q, k, v, dense, dtype=dtype)
    assert_rule(out, ref, naive)
    if dtype != torch.float16:
        t_out = torch_flex(q.detach(), k.detach(), v.detach(), block_mask=bm, enable_gqa=True)
        assert (out.detach().double() - t_out.double()).abs().max() < (2e-5 if dtype == torch.float32 else 3e-2)
    dout = randn(*out.shape, dtype=dtype, seed=4)
    got = torch.autograd.grad(out, (q, k, v), dout)
    ref_g = torch.autograd.grad(ref, (q, k, v), dout)
    naive_g = torch.autograd.grad(naive, (q, k, v), dout)
    for g, r, n, what in zip(got, ref_g, naive_g, ("dq", "dk", "dv")):
        assert_rule(g, r, n, ulps=16, what=what)


@pytest.mark.parametrize("block", [(128, 128), (64, 32), (16, 48), (1, 8)])
@pytest.mark.parametrize("lengths", [(200, 333), (333, 200), (1, 129)])
def test_block_sizes_and_uneven_lengths(block, lengths):
    Sq, Sk = lengths
    B, H, D = 1, 2, 32
    keep = torch.rand(Sq, Sk, generator=torch.Generator().manual_seed(Sq + Sk)) < 0.5

    def mod(b, h, q, kv):
        return keep[q, kv] | (kv < 5)

    bm = create_block_mask(mod, None, None, Sq, Sk, device="cpu", BLOCK_SIZE=block)
    q, k, v = _qkv(B, H, H, Sq, Sk, D, torch.float32, seed=Sq)
    out, lse = flashattn.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    t_out, t_lse = torch_flex(q, k, v, block_mask=bm, return_lse=True)
    assert (out - t_out).abs().max() < 2e-5
    assert (lse - t_lse).abs().max() < 2e-4


def test_no_block_mask_and_scale():
    B, H, S, D = 2, 3, 150, 48
    q, k, v = _qkv(B, H, H, S, S, D, torch.float32, seed=11)
    for scale in (None, 0.3):
        out = flashattn.flex_attention(q, k, v, scale=scale)
        ref = torch_flex(q, k, v, scale=scale)
        assert (out - ref).abs().max() < 2e-5


def test_full_blocks_only_mask():
    """A BlockMask of full blocks alone (from_kv_blocks with full_kv_*): no element bits."""
    S, D = 256, 32
    # q block 0 sees kv block 0, q block 1 sees kv blocks 0 and 1, all whole
    num = torch.zeros(1, 1, 2, dtype=torch.int32)
    idx = torch.zeros(1, 1, 2, 2, dtype=torch.int32)
    full_num = torch.tensor([[[1, 2]]], dtype=torch.int32)
    full_idx = torch.tensor([[[[0, 0], [0, 1]]]], dtype=torch.int32)
    bm = fa.BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=128, seq_lengths=(S, S))
    q, k, v = _qkv(1, 2, 2, S, S, D, torch.float32, seed=2)
    out = flashattn.flex_attention(q, k, v, block_mask=bm)
    i = torch.arange(S)
    dense = (i[:, None] // 128 >= i[None, :] // 128)
    ref, _ = _oracle(q, k, v, dense)
    naive, _ = _oracle(q, k, v, dense, dtype=torch.float32)
    assert_rule(out, ref, naive)


# ---------------------------------------------------------------- score_mods
def test_score_mods_match_torch():
    B, H, S, D = 1, 4, 200, 32
    q, k, v = _qkv(B, H, H, S, S, D, torch.float32, seed=21)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    bias = randn(1, H, S, S, seed=22)
    bm = create_block_mask(causal, None, None, S, S, device="cpu")
    mods = [score_mods.softcap(2.0), score_mods.alibi(slopes), score_mods.bias(bias),
            score_mods.combine(score_mods.alibi(slopes), score_mods.softcap(3.0), score_mods.bias(bias[0, 1]))]
    for mod in mods:
        out, lse = flashattn.flex_attention(q, k, v, score_mod=mod, block_mask=bm, return_lse=True)
        t_out, t_lse = torch_flex(q, k, v, score_mod=mod, block_mask=bm, return_lse=True)
        assert (out - t_out).abs().max() < 3e-5, mod
        assert (lse - t_lse).abs().max() < 3e-4, mod


def test_alibi_uneven_lengths_and_gradient():
    B, H, Sq, Sk, D = 1, 2, 90, 170, 32
    slopes = torch.tensor([0.3, 0.05])
    q, k, v = _qkv(B, H, H, Sq, Sk, D, torch.float32, seed=31, grad=True)
    mod = score_mods.combine(score_mods.alibi(slopes), score_mods.softcap(5.0))
    out = flashattn.flex_attention(q, k, v, score_mod=mod)
    t_out = torch_flex(q.detach(), k.detach(), v.detach(), score_mod=mod)
    assert (out.detach() - t_out).abs().max() < 3e-5
    # the oracle's ALiBi is bottom-right, |i + Sk - Sq - j|: torch's |q_idx - kv_idx|
    # is it with the key positions moved by Sk - Sq
    i, j = torch.arange(Sq)[:, None], torch.arange(Sk)[None, :]
    bias = -slopes[None, :, None, None].double() * (i - j).abs().double()
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    ref, _ = attn_ref(qh, kh, vh, softcap=5.0, bias=bias)
    dout = randn(B, H, Sq, D, seed=32)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(ref.transpose(1, 2), (q, k, v), dout)
    for g, r in zip(got, want):
        assert (g.double() - r).abs().max() < 1e-4


# ---------------------------------------------------------------- what is refused
def test_value_errors():
    B, H, S, D = 1, 2, 128, 32
    q, k, v = _qkv(B, H, H, S, S, D, torch.float32)
    with pytest.raises(ValueError, match="score_mod must be None or a flashattn.score_mods"):
        flashattn.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s * 2)
    bm_long = create_block_mask(causal, None, None, 256, 256, device="cpu")
    with pytest.raises(ValueError, match="BlockMask"):
        flashattn.flex_attention(q, k, v, block_mask=bm_long)
    bm_b3 = create_block_mask(causal, 3, None, S, S, device="cpu")
    with pytest.raises(ValueError, match=r"\(B, H\)"):
        flashattn.flex_attention(q, k, v, block_mask=bm_b3)
    bm_h5 = create_block_mask(causal, None, 5, S, S, device="cpu")
    with pytest.raises(ValueError, match=r"\(B, H\)"):
        flashattn.flex_attention(q, k, v, block_mask=bm_h5)
    with pytest.raises(ValueError, match="enable_gqa"):
        flashattn.flex_attention(q, k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match="multiple"):
        flashattn.flex_attention(q[:, :1].expand(1, 3, S, D), k, v, enable_gqa=True)
    with pytest.raises(ValueError, match="4-d"):
        flashattn.flex_attention(q[0], k, v)
    with pytest.raises(ValueError, match="one dtype"):
        flashattn.flex_attention(q, k.bfloat16(), v)
    with pytest.raises(ValueError, match="block_mask must be a torch BlockMask"):
        flashattn.flex_attention(q, k, v, block_mask=torch.ones(S, S, dtype=torch.bool))
    far = create_block_mask(causal, None, None, S, S, device="cpu")
    far.kv_indices[...] = 3  # past the one kv block (BlockMask's own constructors check theirs)
    with pytest.raises(ValueError, match=r"kv_indices must be in \[0, 1\)"):
        flashattn.flex_attention(q, k, v, block_mask=far)
    bias = torch.zeros(1, H, S, S, requires_grad=True)
    with pytest.raises(ValueError, match="bias that requires grad"):
        flashattn.flex_attention(q, k, v, score_mod=score_mods.bias(bias))
    with pytest.raises(ValueError, match="slopes"):
        flashattn.flex_attention(q, k, v, score_mod=score_mods.alibi(torch.ones(3)))
    with pytest.raises(ValueError, match="softcap"):
        score_mods.softcap(0.0)
    with pytest.raises(ValueError, match="twice"):
        score_mods.combine(score_mods.softcap(1.0), score_mods.softcap(2.0))


def test_block_mask_binding_checks_lengths():
    """The binding's tuple: array lengths the plain pointers do not carry are checked."""
    import numpy as np

    q = np.zeros((1, 8, 1, 16), np.float32)
    out = np.empty_like(q)
    from flashattn import _C, _core

    raw = _core.current_context()
    good = (4, 4, 1, 1, 2, np.array([0, 1, 2], np.int64), np.array([0, 1], np.int32), None, None)
    _C.forward(raw, q, q, q, out, None, block_mask=good)
    short = good[:5] + (np.array([0, 1], np.int64),) + good[6:]
    with pytest.raises(ValueError, match="offsets must have"):
        _C.forward(raw, q, q, q, out, None, block_mask=short)
    bits = good[:7] + (np.array([0, -1], np.int64), np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match="whole element masks"):
        _C.forward(raw, q, q, q, out, None, block_mask=bits)
    huge = (4, 4, 2**40, 2**40, 2**20) + good[5:]
    with pytest.raises(ValueError, match="fit in 64 bits"):
        _C.forward(raw, q, q, q, out, None, block_mask=huge)
    bad_kv = good[:6] + (np.array([0, 7], np.int32),) + good[7:]
    with pytest.raises(ValueError, match="fa_forward"):
        _C.forward(raw, q, q, q, out, None, block_mask=bad_kv)


def test_conversion_is_kept_with_the_mask():
    S = 256
    calls = []

    def mod(b, h, q, kv):
        calls.append(1)
        return q >= kv

    bm = create_block_mask(mod, None, None, S, S, device="cpu")
    q, k, v = _qkv(1, 2, 2, S, S, 32, torch.float32)
    calls.clear()
    a = flashattn.flex_attention(q, k, v, block_mask=bm)
    n = len(calls)
    assert n > 0  # the partial (diagonal) blocks' bits came from the mask_mod
    b = flashattn.flex_attention(q, k, v, block_mask=bm)
    assert len(calls) == n and torch.equal(a, b)


def test_compile_traces_the_op():
    S = 128
    bm = create_block_mask(causal, None, None, S, S, device="cpu")
    q, k, v = _qkv(1, 2, 2, S, S, 32, torch.float32)
    want = flashattn.flex_attention(q, k, v, block_mask=bm)
    got = torch.compile(lambda a, b, c: flashattn.flex_attention(a, b, c, block_mask=bm), fullgraph=False)(q, k, v)
    assert (got - want).abs().max() == 0
    assert math.isfinite(got.sum().item())
