"""test_threads_compile.py: Python threads against serial calls, and torch.compile.

Threads: 8 Python threads calling at once, each on its own per-thread default
context, must give results bitwise identical to the same calls made serially
(the library plans by shapes, never by thread count, and the GIL is released
during the calls, so they really overlap).

torch.compile: a module that calls flash_attn_func compiles with fullgraph=True
(any graph break is an error), dynamo's explain() counts no break, and the
compiled module's output and gradients equal eager's.
"""

import threading

import numpy as np
import pytest

from conftest import needs_torch, randn, torch

pytestmark = needs_torch

if torch is not None:
    import flashattn
    from flashattn import flash_attn_func


def _problems():
    out = []
    for t in range(8):
        q = randn(1, 64 + 8 * t, 4, 32, seed=100 + t)
        k = randn(1, 96, 2, 32, seed=200 + t)
        v = randn(1, 96, 2, 32, seed=300 + t)
        out.append((q, k, v))
    return out


def test_eight_threads_equal_serial_bitwise():
    probs = _problems()
    serial_t = [flash_attn_func(q, k, v, causal=True) for q, k, v in probs]
    serial_n = [flash_attn_func(q.numpy(), k.numpy(), v.numpy(), causal=True) for q, k, v in probs]
    serial_g = []
    for q, k, v in probs:
        qq = q.clone().requires_grad_()
        flash_attn_func(qq, k, v, causal=True).sum().backward()
        serial_g.append(qq.grad)
    results = [None] * 8
    barrier = threading.Barrier(8)
    errors = []

    def work(t):
        try:
            q, k, v = probs[t]
            barrier.wait()
            outs = []
            for _ in range(5):
                outs.append(flash_attn_func(q, k, v, causal=True))
                outs.append(flash_attn_func(q.numpy(), k.numpy(), v.numpy(), causal=True))
            qq = q.clone().requires_grad_()
            flash_attn_func(qq, k, v, causal=True).sum().backward()
            results[t] = (outs, qq.grad, flashattn.current_context())
        except Exception as e:  # reported below with the thread number
            errors.append((t, repr(e)))

    ts = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    contexts = {id(r[2]) for r in results}
    assert len(contexts) == 8, "threads shared a default context"
    for t, (outs, grad, _) in enumerate(results):
        for i, o in enumerate(outs):
            want = serial_t[t] if i % 2 == 0 else serial_n[t]
            if isinstance(o, np.ndarray):
                assert np.array_equal(o, want), f"thread {t} call {i} (numpy) differs"
            else:
                assert torch.equal(o, want), f"thread {t} call {i} differs"
        assert torch.equal(grad, serial_g[t]), f"thread {t} gradient differs"


class _Block(torch.nn.Module if torch is not None else object):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, 4, 8).unbind(2)
        return self.proj(flash_attn_func(q, k, v, causal=True).reshape(B, S, 32))


def test_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    m = _Block()
    x = torch.randn(2, 24, 32)
    explain = torch._dynamo.explain(m)(x)
    assert explain.graph_break_count == 0, explain.break_reasons
    compiled = torch.compile(m, fullgraph=True)  # the default backend, inductor
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, yc = m(xe), compiled(xc)
    assert torch.allclose(ye, yc, atol=1e-6, rtol=0)
    ye.sum().backward()
    ge = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    yc.sum().backward()
    for a, b in zip(ge, (p.grad for p in m.parameters())):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)  # inductor sums the bias grad in its own order
    assert torch.allclose(xe.grad, xc.grad, atol=1e-6, rtol=0)


def test_custom_ops_pass_opcheck():
    # torch.library's own consistency checks of schema, fake kernel and autograd registration
    q = randn(1, 8, 2, 16, seed=1).requires_grad_()
    k = randn(1, 8, 2, 16, seed=2).requires_grad_()
    v = randn(1, 8, 2, 16, seed=3).requires_grad_()
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v), dict(causal=1))


def test_registered_autograd_equals_eager_bitwise():
    # the dispatcher path (torch.ops.flashattn.fwd and its registered autograd, what
    # torch.compile uses) and the eager autograd.Function give the same bits
    q0, k0, v0 = randn(1, 12, 4, 16, seed=4), randn(1, 12, 2, 16, seed=5), randn(1, 12, 2, 8, seed=6)
    grads = []
    for via_op in (False, True):
        q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
        if via_op:
            out = torch.ops.flashattn.fwd(q, k, v, causal=1)[0]
        else:
            out = flash_attn_func(q, k, v, causal=True)
        out.backward(randn(*out.shape, seed=7))
        grads.append((out.detach(), q.grad, k.grad, v.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_thread_count_does_not_change_bits():
    # the library plans by shapes only: 1 and 2 worker threads give the same bits
    q, k, v = randn(2, 200, 4, 32, seed=8), randn(2, 300, 2, 32, seed=9), randn(2, 300, 2, 32, seed=10)
    res = []
    for n in (1, 2):
        with flashattn.Context(threads=n):
            qq = q.clone().requires_grad_()
            o = flash_attn_func(qq, k, v, causal=True)
            o.backward(torch.ones_like(o))
            res.append((o.detach(), qq.grad))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])
