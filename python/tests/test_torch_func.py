"""test_torch_func.py: flash_attn_func and friends on torch tensors, forward and gradients.

Every case is judged by the accuracy rule against the float64 formula of
conftest.attn_ref (docs/semantics.md's steps), in f32, bf16 and f16, for each
option of the flash-attn 2.x API and the extensions beyond it.
"""

import pytest

from conftest import assert_rule, attn_ref, needs_torch, randn, torch

pytestmark = needs_torch

if torch is not None:
    import flashattn
    from flashattn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func

DTYPES = ["float32", "bfloat16", "float16"]

# (name, flash_attn_func kwargs, attn_ref kwargs); shapes below
CASES = [
    ("plain", {}, {}),
    ("causal", {"causal": True}, {"causal": "bottom-right"}),
    ("top_left", {"causal": "top-left"}, {"causal": "top-left"}),
    ("window", {"window_size": (5, 3)}, {"window": (5, 3)}),
    ("causal_window", {"causal": True, "window_size": (7, -1)}, {"causal": "bottom-right", "window": (7, -1)}),
    ("softcap", {"softcap": 2.0}, {"softcap": 2.0}),
    ("scale", {"softmax_scale": 0.3}, {"scale": 0.3}),
    ("alibi", {"alibi": True}, {"alibi": True}),
    ("alibi_batch_causal", {"alibi_batch": True, "causal": True}, {"alibi_batch": True, "causal": "bottom-right"}),
    ("bool_mask", {"bool_mask": True}, {"bool_mask": True}),
    ("float_mask", {"float_mask": True}, {"float_mask": True}),
]


def _inputs(dtype, B=2, Sq=19, Sk=27, Hq=4, Hk=2, D=16, Dv=24, seed=0):
    q = randn(B, Sq, Hq, D, dtype=dtype, seed=seed)
    k = randn(B, Sk, Hk, D, dtype=dtype, seed=seed + 1)
    v = randn(B, Sk, Hk, Dv, dtype=dtype, seed=seed + 2)
    return q, k, v


def _extras(fa_kw, ref_kw, B, Hq, Sq, Sk, dtype):
    fa_kw, ref_kw = dict(fa_kw), dict(ref_kw)
    if fa_kw.pop("alibi", False):
        slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
        fa_kw["alibi_slopes"] = slopes
        ref_kw["alibi"] = slopes
    if fa_kw.pop("alibi_batch", False):
        ref_kw.pop("alibi_batch")
        slopes = torch.rand(B, Hq, generator=torch.Generator().manual_seed(8))  # one slope per (b, h)
        fa_kw["alibi_slopes"] = slopes
        ref_kw["alibi"] = slopes
    if fa_kw.pop("bool_mask", False):
        ref_kw.pop("bool_mask")
        gen = torch.Generator().manual_seed(7)
        m = torch.rand(B, 1, Sq, Sk, generator=gen) < 0.75  # broadcast over heads
        m[..., -1] = True
        fa_kw["attn_mask"] = m
        ref_kw["mask"] = m
    if fa_kw.pop("float_mask", False):
        ref_kw.pop("float_mask")
        b = randn(Hq, 1, Sk, dtype=dtype, seed=9)  # broadcast over batch and query rows
        fa_kw["attn_mask"] = b
        ref_kw["bias"] = b
    return fa_kw, ref_kw


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,fa_kw,ref_kw", CASES, ids=[c[0] for c in CASES])
def test_forward_and_gradients(name, fa_kw, ref_kw, dtype):
    dt = getattr(torch, dtype)
    q, k, v = _inputs(dt)
    B, Sq, Hq, _ = q.shape
    fa_kw, ref_kw = _extras(fa_kw, ref_kw, B, Hq, Sq, k.shape[1], dt)
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    out, lse, _ = flash_attn_func(qs, ks, vs, return_attn_probs=True, **fa_kw)
    assert out.dtype == dt and out.shape == (2, 19, 4, 24)
    dout = randn(*out.shape, dtype=dt, seed=11)
    out.backward(dout)

    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    ro, rl = attn_ref(q64, k64, v64, **ref_kw)
    ro.backward(dout.double())
    qn, kn, vn = (x.clone().requires_grad_() for x in (q, k, v))
    no, nl = attn_ref(qn, kn, vn, dtype=dt, **ref_kw)
    no.backward(dout)

    assert_rule(out, ro.detach(), no.detach(), what="out")
    assert_rule(lse, rl.detach(), nl.detach(), what="lse")
    for got, ref, naive, w in ((qs, q64, qn, "dq"), (ks, k64, kn, "dk"), (vs, v64, vn, "dv")):
        assert got.grad.dtype == dt
        assert_rule(got.grad, ref.grad, naive.grad, ulps=16, what=w)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_non_contiguous_inputs(dtype):
    # q from a BNSD buffer (transposed view), k a slice along seq and dim, v with a
    # negative-free but padded head stride; gradients land in the views' shapes.
    dt = getattr(torch, dtype)
    qb = randn(2, 4, 21, 16, dtype=dt, seed=20)
    q = qb.transpose(1, 2)
    k = randn(2, 50, 2, 32, dtype=dt, seed=21)[:, ::2, :, 8:24]
    v = randn(2, 25, 3, 24, dtype=dt, seed=22)[:, :, 1:]
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    qs, ks, vs = (x.detach().requires_grad_() for x in (q, k, v))
    out = flash_attn_func(qs, ks, vs, causal=True)
    dout = randn(*out.shape, dtype=dt, seed=23).transpose(0, 1).contiguous().transpose(0, 1)  # strided dout too
    out.backward(dout)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    ro, _ = attn_ref(q64, k64, v64, causal="bottom-right")
    ro.backward(dout.double())
    qn, kn, vn = (x.detach().clone().requires_grad_() for x in (q, k, v))
    no, _ = attn_ref(qn, kn, vn, causal="bottom-right", dtype=dt)
    no.backward(dout)
    assert_rule(out, ro.detach(), no.detach())
    for got, ref, naive, w in ((qs, q64, qn, "dq"), (ks, k64, kn, "dk"), (vs, v64, vn, "dv")):
        assert got.grad.shape == got.shape
        assert_rule(got.grad, ref.grad, naive.grad, ulps=16, what=w)


def test_packed_variants_match_unpacked():
    qkv = randn(2, 13, 3, 2, 16, seed=30)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    ref, _ = attn_ref(qkv[:, :, 0].double(), qkv[:, :, 1].double(), qkv[:, :, 2].double(), causal="bottom-right")
    assert_rule(out, ref, attn_ref(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal="bottom-right",
                                   dtype=torch.float32)[0])
    q, kv = randn(2, 7, 4, 16, seed=31), randn(2, 13, 2, 2, 16, seed=32)
    out2 = flash_attn_kvpacked_func(q, kv)
    ref2, _ = attn_ref(q.double(), kv[:, :, 0].double(), kv[:, :, 1].double())
    assert_rule(out2, ref2, attn_ref(q, kv[:, :, 0], kv[:, :, 1], dtype=torch.float32)[0])
    # gradient through the packed tensor (the views' grads meet in one buffer)
    p = qkv.clone().requires_grad_()
    flash_attn_qkvpacked_func(p).sum().backward()
    p64 = qkv.double().requires_grad_()
    attn_ref(p64[:, :, 0], p64[:, :, 1], p64[:, :, 2])[0].sum().backward()
    assert (p.grad.double() - p64.grad).abs().max().item() < 1e-5


def test_mqa_and_empty_rows():
    # MQA (one kv head) and Sq > Sk bottom-right: the first Sq - Sk rows keep nothing -> 0, lse -inf
    q, k, v = randn(1, 9, 4, 8, seed=40), randn(1, 5, 1, 8, seed=41), randn(1, 5, 1, 8, seed=42)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.all(out[:, :4] == 0) and torch.all(torch.isneginf(lse[:, :, :4]))
    ro, _ = attn_ref(q.double(), k.double(), v.double(), causal="bottom-right")
    assert (out.double() - ro).abs().max().item() < 1e-6


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mqa_gradients_two_pass_same_bits(dtype):
    # one MQA sequence: a single (sequence, kv head) walk, so on 2 threads the backward
    # runs two passes (key tiles, then query blocks); the gradients must be the
    # 1-thread fused run's bit for bit, and right by the rule
    dt = getattr(torch, dtype)
    q, k, v = randn(1, 150, 4, 32, dtype=dt, seed=60), randn(1, 170, 1, 32, dtype=dt, seed=61), \
        randn(1, 170, 1, 32, dtype=dt, seed=62)
    dout = randn(1, 150, 4, 32, dtype=dt, seed=63)
    grads, passes = [], []
    for threads in (1, 2):
        with flashattn.Context(threads=threads) as ctx:
            qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
            flash_attn_func(qs, ks, vs, causal=True).backward(dout)
            passes.append(ctx.last()["backward_passes"])
            grads.append((qs.grad, ks.grad, vs.grad))
    assert passes == [1, 2]
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    attn_ref(q64, k64, v64, causal="bottom-right")[0].backward(dout.double())
    qn, kn, vn = (x.clone().requires_grad_() for x in (q, k, v))
    attn_ref(qn, kn, vn, dtype=dt, causal="bottom-right")[0].backward(dout)
    for got, ref, naive, w in zip(grads[1], (q64, k64, v64), (qn, kn, vn), ("dq", "dk", "dv")):
        assert_rule(got, ref.grad, naive.grad, ulps=16, what=w)


def test_capsule_only_reference_lives_through_the_call():
    # A DLPack capsule that is the only reference to its tensor (to_dlpack of a
    # temporary, as the package makes for converted alibi slopes) hands the tensor to
    # the binding, which must keep it until fa_forward returns. 64 MB tensors are
    # mmapped by the allocator, so one freed too early is unmapped and a read or write
    # of it faults: run in a subprocess and ask for a clean exit and the right result.
    import subprocess
    import sys

    code = """
import torch, flashattn
from flashattn import _C
from torch.utils.dlpack import to_dlpack as dl
ctx = flashattn.current_context()
g = torch.Generator().manual_seed(0)
q = torch.randn(1, 8192, 16, 128, generator=g)            # 64 MB
k, v = torch.randn(1, 8, 16, 128, generator=g), torch.randn(1, 8, 16, 128, generator=g)
want = torch.empty_like(q)
_C.forward(ctx, dl(q), dl(k), dl(v), dl(want))
for _ in range(3):
    got = torch.empty_like(q)
    _C.forward(ctx, dl(q.clone()), dl(k.clone()), dl(v.clone()), dl(got))   # temporary inputs
    assert torch.equal(got, want)
    _C.forward(ctx, dl(q), dl(k), dl(v), dl(torch.empty_like(q)))           # a temporary output
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-2000:])


def test_no_grad_and_inference_mode_paths():
    q = randn(1, 8, 2, 16, seed=50)
    a = flash_attn_func(q, q, q)
    with torch.inference_mode():
        b = flash_attn_func(q, q, q)
    qq = q.clone().requires_grad_()
    c = flash_attn_func(qq, qq, qq)
    assert c.requires_grad and not a.requires_grad
    assert torch.equal(a, b) and torch.equal(a, c.detach())


def test_torch_errors():
    q = randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="CPU"):
        flash_attn_func(q.to("meta"), q.to("meta"), q.to("meta"))
    with pytest.raises(ValueError, match="unsupported dtype"):
        flash_attn_func(q.double(), q.double(), q.double())
    with pytest.raises(ValueError, match="4-d"):
        flash_attn_func(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="requires grad"):
        flash_attn_func(q, q, q, attn_mask=torch.zeros(8, 8, requires_grad=True))
    with pytest.raises(ValueError, match="BROADCAST|broadcast"):
        flash_attn_func(q, q, q, attn_mask=torch.ones(3, 8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="shape|head"):
        flash_attn_func(q, q[..., :8], q)


@pytest.mark.parametrize("qshape,kshape", [((0, 4, 2, 8), (0, 4, 2, 8)), ((1, 0, 2, 8), (1, 4, 2, 8)),
                                           ((1, 3, 2, 8), (1, 0, 2, 8))], ids=["B=0", "Sq=0", "Sk=0"])
def test_empty_shapes(qshape, kshape):
    # docs/semantics.md, section 9: B or Sq = 0 is a no-op, Sk = 0 gives o = 0 and lse = -inf
    q = torch.randn(*qshape, requires_grad=True)
    k = torch.randn(*kshape, requires_grad=True)
    out, lse, _ = flash_attn_func(q, k, k, return_attn_probs=True)
    assert out.shape == qshape and lse.shape == (qshape[0], qshape[2], qshape[1])
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))
    out.sum().backward()
    assert q.grad.shape == qshape and torch.all(q.grad == 0) and torch.all(k.grad == 0)
