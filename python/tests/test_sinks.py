"""test_sinks.py: attention sinks (`sinks=`, docs/semantics.md step 6) from Python.

The oracle is torch's math attention in float64 with the sink rule written out as
gpt-oss writes it: the scaled, masked scores get one more column holding the
head's sink logit, the softmax runs over all of them, and the sink's column is
dropped before P @ V. Its lse is the log-sum-exp of the same row, sink included.
Gradients (q, k, v and the sinks) are that formula's autograd in float64. The
accuracy rule is conftest's: twice the same formula's error in the input dtype plus
a few ulps. Forms: flash_attn_func (torch and NumPy), the packed variants,
flash_attn_varlen_func, flash_attn_with_kvcache (contiguous and paged, split-KV).
"""


import numpy as np
import pytest

from conftest import assert_rule, needs_torch, randn, sink_ref, torch

pytestmark = needs_torch

import flashattn  # noqa: E402
from flashattn import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,  # noqa: E402
                       flash_attn_varlen_func, flash_attn_with_kvcache)


def _inputs(B, Sq, Sk, Hq, Hk, D, dtype, seed):
    q = randn(B, Sq, Hq, D, dtype=dtype, seed=seed)
    k = randn(B, Sk, Hk, D, dtype=dtype, seed=seed + 1)
    v = randn(B, Sk, Hk, D, dtype=dtype, seed=seed + 2)
    sinks = randn(Hq, dtype=torch.float32, seed=seed + 3, scale=2.0)
    return q, k, v, sinks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_func_forward_and_grads(dtype, causal):
    q, k, v, sinks = _inputs(2, 37, 45 if not causal else 29, 4, 2, 32, dtype, 11)
    sinks[0] = 30.0  # a sink above every score: that head's o nearly 0
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, sinks)]
    out, lse, _ = flash_attn_func(*leaves[:3], causal=causal, sinks=leaves[3], return_attn_probs=True)
    ref, lref = sink_ref(q, k, v, sinks, causal=causal)
    naive, _ = sink_ref(q, k, v, sinks, causal=causal, dtype=torch.float32 if dtype == torch.float32 else dtype)
    assert_rule(out, ref, naive, what="out")
    assert torch.allclose(lse.double(), lref, atol=1e-5, rtol=1e-5)
    dout = randn(*out.shape, dtype=dtype, seed=5)
    out.backward(dout)
    refs = [x.double().clone().requires_grad_(True) for x in (q, k, v, sinks)]
    r, _ = sink_ref(*refs, causal=causal)
    r.backward(dout.double())
    tol = 2e-4 if dtype == torch.float32 else 5e-2
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), leaves, refs):
        err = (got.grad.double() - want.grad).abs().max().item()
        top = max(1.0, want.grad.abs().max().item())
        assert err <= tol * top, f"{name}: max error {err:.3g} (scale {top:.3g})"


def test_sinks_in_bf16_get_their_gradient_in_bf16():
    q, k, v, sinks = _inputs(1, 16, 16, 2, 2, 16, torch.float32, 3)
    s = sinks.to(torch.bfloat16).requires_grad_(True)  # a model's parameter in bf16
    out = flash_attn_func(q, k, v, sinks=s)
    out.sum().backward()
    assert s.grad is not None and s.grad.dtype == torch.bfloat16 and s.grad.shape == (2,)


def test_no_sinks_and_minus_inf_are_the_same():
    q, k, v, _ = _inputs(2, 9, 13, 4, 2, 16, torch.float32, 21)
    a = flash_attn_func(q, k, v, causal=True)
    b = flash_attn_func(q, k, v, causal=True, sinks=torch.full((4,), float("-inf")))
    assert torch.equal(a, b)


def test_empty_rows_and_bad_values():
    q, k, v, sinks = _inputs(1, 8, 3, 2, 2, 16, torch.float32, 31)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, sinks=sinks, return_attn_probs=True)
    # bottom-right causal with Sq > Sk: the first 5 rows keep no key
    assert torch.equal(out[:, :5], torch.zeros_like(out[:, :5]))
    assert torch.equal(lse[:, :, :5], sinks.reshape(1, 2, 1).expand(1, 2, 5))
    with pytest.raises(ValueError, match="sinks"):
        flash_attn_func(q, k, v, sinks=torch.tensor([0.0, float("inf")]))
    with pytest.raises(ValueError, match="sinks"):
        flash_attn_func(q, k, v, sinks=torch.zeros(3))  # not nheads values


def test_numpy_and_packed():
    q, k, v, sinks = _inputs(2, 12, 12, 4, 4, 16, torch.float32, 41)
    ref, _ = sink_ref(q, k, v, sinks, causal=True)
    got = flash_attn_func(q.numpy(), k.numpy(), v.numpy(), causal=True, sinks=sinks.numpy())
    assert np.abs(got - ref.numpy()).max() < 1e-5
    qkv = torch.stack([q, k, v], dim=2)
    assert (flash_attn_qkvpacked_func(qkv, causal=True, sinks=sinks).double() - ref).abs().max() < 1e-5
    kv = torch.stack([k, v], dim=2)
    assert (flash_attn_kvpacked_func(q, kv, causal=True, sinks=sinks).double() - ref).abs().max() < 1e-5


def test_varlen_forward_and_grads():
    lens_q, lens_k = [5, 0, 17, 9], [7, 3, 17, 30]
    Hq, Hk, D = 4, 2, 32
    cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32)
    q = randn(int(cu_q[-1]), Hq, D, seed=51)
    k = randn(int(cu_k[-1]), Hk, D, seed=52)
    v = randn(int(cu_k[-1]), Hk, D, seed=53)
    sinks = randn(Hq, seed=54, scale=2.0)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, sinks)]
    out = flash_attn_varlen_func(*leaves[:3], cu_q, cu_k, max(lens_q), max(lens_k), causal=True, sinks=leaves[3])
    dout = randn(*out.shape, seed=55)
    out.backward(dout)
    refs = [x.double().clone().requires_grad_(True) for x in (q, k, v, sinks)]
    outs = []
    for b in range(len(lens_q)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        o, _ = sink_ref(refs[0][None, qs], refs[1][None, ks], refs[2][None, ks], refs[3], causal=True)
        outs.append(o[0])
    ref = torch.cat(outs)
    assert (out.double() - ref).abs().max().item() < 1e-5
    ref.backward(dout.double())
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), leaves, refs):
        err = (got.grad.double() - want.grad).abs().max().item()
        assert err <= 2e-4 * max(1.0, want.grad.abs().max().item()), f"{name}: {err:.3g}"


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("num_splits", [0, 1, 3])
def test_kvcache(paged, num_splits):
    B, Hq, Hk, D, page = 3, 8, 2, 64, 16
    lens = torch.tensor([100, 1, 63], dtype=torch.int32)  # before the append of one row
    k_all = randn(B, 128, Hk, D, seed=61)
    v_all = randn(B, 128, Hk, D, seed=62)
    q = randn(B, 1, Hq, D, seed=63)
    sinks = randn(Hq, seed=64, scale=2.0)
    k_new, v_new = randn(B, 1, Hk, D, seed=65), randn(B, 1, Hk, D, seed=66)
    if paged:
        pages = torch.randperm(B * 8, generator=torch.Generator().manual_seed(7)).to(torch.int32).reshape(B, 8)
        kc = torch.full((B * 8, page, Hk, D), float("nan"))
        vc = torch.full((B * 8, page, Hk, D), float("nan"))
        for b in range(B):
            for j in range(int(lens[b])):
                kc[pages[b, j // page], j % page] = k_all[b, j]
                vc[pages[b, j // page], j % page] = v_all[b, j]
    else:
        pages = None
        kc, vc = k_all.clone(), v_all.clone()
    out, lse = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=pages, causal=True,
                                       num_splits=num_splits, return_softmax_lse=True, sinks=sinks)
    for b in range(B):
        n = int(lens[b])
        kk = torch.cat([k_all[b, :n], k_new[b]])[None]
        vv = torch.cat([v_all[b, :n], v_new[b]])[None]
        ref, lref = sink_ref(q[b:b + 1], kk, vv, sinks, causal=True)
        assert (out[b:b + 1].double() - ref).abs().max().item() < 1e-5
        assert (lse[b:b + 1].double() - lref).abs().max().item() < 1e-5


def test_custom_op_with_sinks_passes_opcheck():
    # the dispatcher path (torch.compile, the profiler): schema, fake tensor and the
    # registered autograd, with the sinks taking a gradient
    q, k, v, sinks = _inputs(1, 8, 10, 2, 2, 16, torch.float32, 71)
    q.requires_grad_(True), sinks.requires_grad_(True)
    kwargs = dict(sinks=sinks, causal=1)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v), kwargs)
    out, _, _ = torch.ops.flashattn.fwd(q, k, v, **kwargs)
    out.sum().backward()
    r = [x.double().detach().requires_grad_(True) for x in (q, k, v, sinks)]
    ref, _ = sink_ref(*r, causal=True)
    ref.sum().backward()
    assert (sinks.grad.double() - r[3].grad).abs().max().item() < 1e-4
