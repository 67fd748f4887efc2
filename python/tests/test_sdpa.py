"""test_sdpa.py: flashattn.torch.scaled_dot_product_attention and the routing of torch's.

The oracle is torch's own math SDPA in float64 (torch.nn.attention.sdpa_kernel
with the MATH backend): an independent implementation of the very semantics
(BNSD, top-left is_causal, broadcast masks, enable_gqa). The naive term of the
accuracy rule is the same math kernel in the input dtype.
"""

import os
import subprocess
import sys

import pytest

from conftest import assert_rule, needs_torch, randn, torch

pytestmark = needs_torch

if torch is not None:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flashattn.torch as fat


def _math_sdpa(*args, **kw):
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(*args, **kw)


def _masks(N, H, L, S, dtype):
    gen = torch.Generator().manual_seed(3)
    bool_full = torch.rand(N, H, L, S, generator=gen) < 0.7
    bool_full[..., 0] = True
    bool_bcast = torch.rand(L, S, generator=gen) < 0.6
    bool_bcast[:, 0] = True
    flt = randn(N, 1, 1, S, dtype=dtype, seed=5)
    return {"none": None, "bool_full": bool_full, "bool_2d": bool_bcast, "float_bcast": flt}


CASES = [
    ("plain", "none", {}),
    ("causal", "none", {"is_causal": True}),
    ("scale", "none", {"scale": 0.2}),
    ("gqa_causal", "none", {"is_causal": True, "enable_gqa": True}),
    ("bool_full", "bool_full", {}),
    ("bool_2d_gqa", "bool_2d", {"enable_gqa": True}),
    ("float_bcast", "float_bcast", {}),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("name,mask,kw", CASES, ids=[c[0] for c in CASES])
def test_sdpa_against_torch_math_float64(name, mask, kw, dtype):
    dt = getattr(torch, dtype)
    N, Hq, L, S, E, Ev = 2, 4, 17, 23, 16, 8
    Hk = 2 if kw.get("enable_gqa") else Hq
    q, k, v = randn(N, Hq, L, E, dtype=dt, seed=1), randn(N, Hk, S, E, dtype=dt, seed=2), randn(N, Hk, S, Ev,
                                                                                               dtype=dt, seed=3)
    m = _masks(N, Hq, L, S, dt)[mask]
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    fat.reset_stats()
    out = fat.scaled_dot_product_attention(qs, ks, vs, attn_mask=m, **kw)
    assert fat.stats() == {"routed": 1, "fallbacks": {}}
    assert out.shape == (N, Hq, L, Ev) and out.dtype == dt
    dout = randn(*out.shape, dtype=dt, seed=4)
    out.backward(dout)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    m64 = m if m is None or m.dtype == torch.bool else m.double()
    ref = _math_sdpa(q64, k64, v64, attn_mask=m64, **kw)
    ref.backward(dout.double())
    qn, kn, vn = (x.clone().requires_grad_() for x in (q, k, v))
    naive = _math_sdpa(qn, kn, vn, attn_mask=m, **kw)
    naive.backward(dout)
    assert_rule(out, ref.detach(), naive.detach())
    for got, r, n, w in ((qs, q64, qn, "dq"), (ks, k64, kn, "dk"), (vs, v64, vn, "dv")):
        assert_rule(got.grad, r.grad, n.grad, ulps=16, what=w)


@pytest.mark.parametrize("layout", ["bnsd", "bsnd_view"])
@pytest.mark.parametrize("name,mask,kw", CASES, ids=[c[0] for c in CASES])
def test_sdpa_inference_path_against_torch_math_float64(name, mask, kw, layout):
    # No input requires grad: the call takes the lean path (the binding reads BNSD
    # strides itself). bsnd_view: q, k, v are the transposed views a model makes of
    # (N, L, H, E) projections, so that path sees non-contiguous strides too.
    N, Hq, L, S, E, Ev = 2, 4, 17, 23, 16, 8
    Hk = 2 if kw.get("enable_gqa") else Hq
    if layout == "bnsd":
        q, k, v = randn(N, Hq, L, E, seed=1), randn(N, Hk, S, E, seed=2), randn(N, Hk, S, Ev, seed=3)
    else:
        q, k, v = (randn(N, n, h, d, seed=i).transpose(1, 2)
                   for i, (n, h, d) in enumerate(((L, Hq, E), (S, Hk, E), (S, Hk, Ev)), 1))
    m = _masks(N, Hq, L, S, torch.float32)[mask]
    fat.reset_stats()
    out = fat.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
    assert fat.stats() == {"routed": 1, "fallbacks": {}}
    # a transposed view of a (N, L, Hq, Ev) buffer, as torch's CPU flash kernel returns
    assert out.shape == (N, Hq, L, Ev) and out.stride() == (L * Hq * Ev, Ev, Hq * Ev, 1)
    m64 = m if m is None or m.dtype == torch.bool else m.double()
    ref = _math_sdpa(q.double(), k.double(), v.double(), attn_mask=m64, **kw)
    naive = _math_sdpa(q, k, v, attn_mask=m, **kw)
    assert_rule(out, ref, naive)


def test_sdpa_3d_inputs():
    q, k, v = randn(3, 9, 16, seed=6), randn(3, 12, 16, seed=7), randn(3, 12, 8, seed=8)
    m = torch.rand(9, 12, generator=torch.Generator().manual_seed(1)) < 0.7
    m[:, 0] = True
    out = fat.scaled_dot_product_attention(q, k, v, attn_mask=m)
    ref = _math_sdpa(q.double(), k.double(), v.double(), attn_mask=m)
    assert out.shape == (3, 9, 8) and (out.double() - ref).abs().max().item() < 2e-6


def test_stats_count_every_thread_and_outlive_it():
    # stats() is exact over threads that count at once and then end, and an ended
    # thread's tally is folded away rather than kept (one per live thread).
    import threading
    import time

    q = randn(1, 2, 8, 16, seed=21)
    q64 = q.double()
    live_before = len(fat._live)
    fat.reset_stats()

    def work():
        for _ in range(5):
            fat.scaled_dot_product_attention(q, q, q)
        fat.scaled_dot_product_attention(q64, q64, q64)  # falls back: dtype float64

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fat.stats() == {"routed": 20, "fallbacks": {"dtype float64": 4}}
    deadline = time.monotonic() + 5
    while len(fat._live) > live_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(fat._live) <= live_before
    assert fat.stats() == {"routed": 20, "fallbacks": {"dtype float64": 4}}
    fat.reset_stats()
    assert fat.stats() == {"routed": 0, "fallbacks": {}}


def test_routing_enable_disable_and_context_manager():
    q = randn(1, 2, 8, 16, seed=9)
    fat.reset_stats()
    F.scaled_dot_product_attention(q, q, q)
    assert fat.stats()["routed"] == 0 and not fat.is_enabled()
    with fat.sdpa():
        assert fat.is_enabled()
        a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert fat.stats()["routed"] == 1 and not fat.is_enabled()
    fat.enable()
    try:
        b = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        x = torch.ones(2) + 1  # other torch functions pass through untouched
    finally:
        fat.disable()
    assert torch.equal(x, torch.full((2,), 2.0))
    assert fat.stats()["routed"] == 2 and torch.equal(a, b)
    ref = _math_sdpa(q.double(), q.double(), q.double(), is_causal=True)
    assert (a.double() - ref).abs().max().item() < 2e-6


def test_routed_training_step_has_gradients():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 48)
    x = torch.randn(2, 10, 16)
    grads = []
    for routed in (False, True):
        lin.zero_grad()
        qkv = lin(x).view(2, 10, 3, 2, 8).permute(2, 0, 3, 1, 4)
        if routed:
            fat.reset_stats()
            with fat.sdpa():
                y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            assert fat.stats()["routed"] == 1
        else:
            y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        y.square().sum().backward()
        grads.append(lin.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-5)


def test_fallbacks_count_reasons_and_match_torch():
    q = randn(1, 2, 8, 16, seed=10)
    fat.reset_stats()
    with fat.sdpa():
        d = F.scaled_dot_product_attention(q.double(), q.double(), q.double())  # dtype
        bias = torch.zeros(8, 8, requires_grad=True)
        y = F.scaled_dot_product_attention(q, q, q, attn_mask=bias)  # attn_mask requires grad
        y.sum().backward()
        mt = q.to("meta")
        F.scaled_dot_product_attention(mt, mt, mt)  # device
        F.scaled_dot_product_attention(q, q[:, :1], q[:, :1])  # heads without enable_gqa: torch decides
        with pytest.raises(RuntimeError):
            F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool), is_causal=True)
    s = fat.stats()
    assert s["routed"] == 0
    assert s["fallbacks"] == {"dtype float64": 1, "attn_mask requires grad": 1, "device meta": 1, "heads": 1,
                              "attn_mask with is_causal": 1}, s
    assert bias.grad is not None  # torch's kernel gave the mask its gradient
    assert torch.allclose(d, _math_sdpa(q.double(), q.double(), q.double()), atol=1e-12, rtol=0)


def test_verbose_line_on_stderr():
    code = (
        "import torch, torch.nn.functional as F, flashattn.torch as fat\n"
        "q = torch.randn(1, 2, 8, 16)\n"
        "with fat.sdpa():\n"
        "    F.scaled_dot_product_attention(q, q, q, is_causal=True)\n"
        "    F.scaled_dot_product_attention(q.double(), q.double(), q.double())\n")
    env = dict(os.environ, FLASHATTN_VERBOSE="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(__file__))
    assert r.returncode == 0, r.stderr
    assert "flashattn.torch,sdpa,routed,dtype:float32,B:1,Hq:2,Hk:2,Sq:8,Sk:8,D:16" in r.stderr, r.stderr
    assert "causal:top-left" in r.stderr
    assert "flashattn.torch,sdpa,fallback:dtype float64" in r.stderr
    assert "flashattn_verbose" in r.stderr  # and the library's own line for the call it ran


def test_profiler_shows_the_fused_ops():
    # what a user checks to confirm the fused kernel ran (forward and backward)
    q = randn(1, 2, 16, 8, seed=11).requires_grad_()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with fat.sdpa():
            F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    names = {e.key for e in prof.key_averages()}
    assert "flashattn::fwd" in names and "flashattn::bwd" in names, sorted(names)[:40]
