"""test_dropout_grad.py: the dropout mask against SEMANTICS.md's Philox rule, and gradcheck.

Philox4x32-10 is implemented here from SEMANTICS.md alone (conftest.philox4x32_10),
first checked on the published known-answer vectors, then used to predict the
keep-mask that return_attn_probs returns, bit for bit.

gradcheck: the core has no float64 dtype (f32, f16, bf16 only), so a float64
gradcheck cannot reach the library without a rounding step. The check runs in
double around an f32 boundary: inputs are rounded to f32, the REFERENCE algorithm
(plain loops in double inside; Context(algo="reference")) computes forward and
backward, outputs come back as f32 -> double. The f32 rounding of the outputs
(~6e-8 relative) limits the finite differences, so eps = 1e-3 and atol = rtol =
2e-3 instead of gradcheck's double-precision defaults; a wrong gradient term
(e.g. a missing softcap derivative or GQA sum) is far outside that.
"""

import numpy as np
import pytest

from conftest import assert_rule, attn_ref, dropout_keep_rule, needs_torch, philox4x32_10, randn, torch

pytestmark = needs_torch

if torch is not None:
    import flashattn
    from flashattn import flash_attn_func


def test_philox_known_answers():
    kat = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for c, k, want in kat:
        assert philox4x32_10(c, k) == want


def kept(S, Sq, Sk):
    """The keep-mask in flash-attn's S_dmask encoding: the sign bit marks a dropped element."""
    return ~torch.signbit(S[:, :, :Sq, :Sk])


@pytest.mark.parametrize("p,seed,offset", [(0.3, 12345, 0), (0.1, 2**40 + 7, 77), (0.75, 3, 2**32 - 1)])
def test_dropout_mask_is_the_semantics_rule(p, seed, offset):
    B, Sq, Sk, Hq, Hk, D = 2, 9, 23, 4, 2, 8
    q, k, v = randn(B, Sq, Hq, D, seed=1), randn(B, Sk, Hk, D, seed=2), randn(B, Sk, Hk, D, seed=3)
    out, lse, S = flash_attn_func(q, k, v, dropout_p=p, causal=True, return_attn_probs=True, dropout_seed=seed,
                                  dropout_offset=offset)
    keep = kept(S, Sq, Sk)
    want = dropout_keep_rule(B, Hq, Sq, Sk, p, seed, offset)
    assert keep.dtype == torch.bool and keep.shape == (B, Hq, Sq, Sk)
    assert np.array_equal(keep.numpy(), want), f"{(keep.numpy() != want).sum()} of {want.size} bits differ"
    # the mask really is the one applied: the output equals the formula with it
    ro, rl = attn_ref(q.double(), k.double(), v.double(), causal="bottom-right", keep=keep, dropout_p=p)
    no, _ = attn_ref(q, k, v, causal="bottom-right", keep=keep, dropout_p=p, dtype=torch.float32)
    assert_rule(out, ro, no)
    assert (lse.double() - rl).abs().max().item() < 2e-6  # lse is the undropped row's
    # numpy gives the same mask
    _, _, S_np = flash_attn_func(q.numpy(), k.numpy(), v.numpy(), dropout_p=p, causal=True, return_attn_probs=True,
                                 dropout_seed=seed, dropout_offset=offset)
    assert np.array_equal(~np.signbit(S_np[:, :, :Sq, :Sk]), want)


def test_dropout_gradients_use_the_same_mask():
    p, seed = 0.2, 99
    q, k, v = randn(1, 12, 2, 16, seed=4), randn(1, 12, 2, 16, seed=5), randn(1, 12, 2, 16, seed=6)
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    out, _, S = flash_attn_func(qs, ks, vs, dropout_p=p, return_attn_probs=True, dropout_seed=seed)
    keep = kept(S, 12, 12)
    dout = randn(*out.shape, seed=7)
    out.backward(dout)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    ro, _ = attn_ref(q64, k64, v64, keep=keep, dropout_p=p)
    ro.backward(dout.double())
    qn, kn, vn = (x.clone().requires_grad_() for x in (q, k, v))
    attn_ref(qn, kn, vn, keep=keep, dropout_p=p, dtype=torch.float32)[0].backward(dout)
    for got, ref, naive, w in ((qs, q64, qn, "dq"), (ks, k64, kn, "dk"), (vs, v64, vn, "dv")):
        assert_rule(got.grad, ref.grad, naive.grad, ulps=16, what=w)


def test_dropout_seed_follows_torch_manual_seed():
    q = randn(1, 16, 2, 8, seed=8)
    torch.manual_seed(5)
    a = flash_attn_func(q, q, q, dropout_p=0.5)
    torch.manual_seed(5)
    b = flash_attn_func(q, q, q, dropout_p=0.5)
    c = flash_attn_func(q, q, q, dropout_p=0.5)
    assert torch.equal(a, b) and not torch.equal(a, c)


GRADCHECK = [
    ("plain", {}),
    ("causal_gqa", {"causal": True}),
    ("softcap_window", {"softcap": 1.5, "window_size": (3, 2)}),
    ("alibi_top_left", {"causal": "top-left", "alibi_slopes": torch.tensor([0.3, 0.1]) if torch else None}),
    ("bool_mask", {"attn_mask": (torch.arange(6)[:, None] + torch.arange(7)[None] % 3 > 0) if torch else None}),
    ("dropout", {"dropout_p": 0.25, "dropout_seed": 4}),
]


@pytest.mark.parametrize("name,kw", GRADCHECK, ids=[g[0] for g in GRADCHECK])
def test_gradcheck_reference_algorithm(name, kw):
    Hk = 1 if name == "causal_gqa" else 2
    q = randn(1, 6, 2, 4, dtype=torch.float64, seed=10).requires_grad_()
    k = randn(1, 7, Hk, 4, dtype=torch.float64, seed=11).requires_grad_()
    v = randn(1, 7, Hk, 3, dtype=torch.float64, seed=12).requires_grad_()

    def f(q, k, v):
        return flash_attn_func(q.float(), k.float(), v.float(), **kw).double()

    with flashattn.Context(threads=1, algo="reference") as ctx:
        assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-3, atol=2e-3, rtol=2e-3)
        assert ctx.last()["algo"] == "reference"


def test_gradcheck_catches_a_wrong_gradient():
    # the same tolerances reject a gradient that is off by a few percent
    q = randn(1, 6, 2, 4, dtype=torch.float64, seed=13).requires_grad_()

    class Skewed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * 1.03

    def f(q):
        return flash_attn_func(Skewed.apply(q).float(), q.float().detach(), q.float().detach()).double()

    with flashattn.Context(threads=1, algo="reference"):
        assert not torch.autograd.gradcheck(f, (q,), eps=1e-3, atol=2e-3, rtol=2e-3, raise_exception=False)


def test_dropout_on_the_inference_paths_is_the_semantics_rule():
    # Without a gradient, flash_attn_func (no read-outs) and the SDPA route take the
    # lean binding path: the same Philox mask must be applied there.
    p, seed = 0.3, 1234
    B, Sq, Sk, Hq, Hk, D = 2, 9, 23, 4, 2, 8
    q, k, v = randn(B, Sq, Hq, D, seed=11), randn(B, Sk, Hk, D, seed=12), randn(B, Sk, Hk, D, seed=13)
    keep = torch.from_numpy(dropout_keep_rule(B, Hq, Sq, Sk, p, seed, 0))
    ro, _ = attn_ref(q.double(), k.double(), v.double(), causal="bottom-right", keep=keep, dropout_p=p)
    no, _ = attn_ref(q, k, v, causal="bottom-right", keep=keep, dropout_p=p, dtype=torch.float32)
    out = flash_attn_func(q, k, v, dropout_p=p, causal=True, dropout_seed=seed)
    assert_rule(out, ro, no)

    import flashattn.torch as fat

    torch.manual_seed(7)
    drawn = int(torch.randint(0, 2**62, (1,)).item())  # the seed the route draws after manual_seed(7)
    keep = torch.from_numpy(dropout_keep_rule(B, Hq, Sq, Sk, p, drawn, 0))
    ro, _ = attn_ref(q.double(), k.double(), v.double(), keep=keep, dropout_p=p)
    no, _ = attn_ref(q, k, v, keep=keep, dropout_p=p, dtype=torch.float32)
    torch.manual_seed(7)
    with torch.no_grad():
        got = fat.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=p,
                                               enable_gqa=True)
    assert_rule(got.transpose(1, 2), ro, no)
