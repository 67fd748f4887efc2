"""test_host_pool.py: flashattn.torch runs the library on torch's intra-op pool.

Once flashattn.torch is imported, new contexts hand their parallel work to the
OpenMP runtime torch loaded (fa_context_set_parallel through the binding): the
read-out and the library's verbose line say pool:host, and every output (the
routed SDPA forward and its gradients, flash_attn_func with dropout and its
gradients, a KV-cache decode with an append) is bitwise the own pool's at the same
thread count. FLASHATTN_TORCH_POOL=own and set_pool("own") keep the own threads;
a process without an OpenMP runtime gets a clear reason instead of a host pool.
"""

import os
import subprocess
import sys
import threading

import pytest

from conftest import needs_torch, randn, torch

pytestmark = needs_torch

if torch is not None:
    import flashattn
    import flashattn.torch as ft
    from flashattn import flash_attn_func, flash_attn_with_kvcache


def _threads():
    return max(2, torch.get_num_threads())


def _run_all(ctx):
    """The calls on ctx: the outputs and gradients, and each call's pool read-out."""
    out, pools = [], []
    with ctx:
        q, k, v = (randn(1, 32, 256, 128, seed=s).requires_grad_() for s in (1, 2, 3))  # BNSD, the sweep's shape
        o = ft.scaled_dot_product_attention(q, k, v, is_causal=True)
        pools.append(ctx.last()["pool"])
        o.backward(randn(*o.shape, seed=4))
        pools.append(ctx.last()["pool"])
        out += [o.detach(), q.grad, k.grad, v.grad]

        q, k, v = (randn(2, 90, 4, 32, seed=s).requires_grad_() for s in (5, 6, 7))
        k2, v2 = k.detach()[:, :, :1].clone().requires_grad_(), v.detach()[:, :, :1].clone().requires_grad_()
        o = flash_attn_func(q, k2, v2, dropout_p=0.2, causal=True, dropout_seed=5)  # MQA: the backward's two passes
        pools.append(ctx.last()["pool"])
        o.backward(randn(*o.shape, seed=8))
        pools.append(ctx.last()["pool"])
        out += [o.detach(), q.grad, k2.grad, v2.grad]

        kc, vc = randn(2, 256, 2, 64, seed=9), randn(2, 256, 2, 64, seed=10)
        qd, kn, vn = randn(2, 1, 8, 64, seed=11), randn(2, 1, 2, 64, seed=12), randn(2, 1, 2, 64, seed=13)
        seqlens = torch.tensor([200, 131], dtype=torch.int32)
        od = flash_attn_with_kvcache(qd, kc, vc, kn, vn, cache_seqlens=seqlens)
        pools.append(ctx.last()["pool"])
        out += [od, kc, vc]
    return out, pools


def test_host_pool_is_torchs():
    info = ft.pool_info()
    assert info["pool"] == "host", info
    assert "gomp" in info["runtime"] or "omp" in os.path.basename(info["runtime"]), info
    ctx = flashattn.Context(threads=_threads())
    assert ctx.pool == "host"


def test_bits_host_equal_own():
    n = _threads()
    host, own = flashattn.Context(threads=n), flashattn.Context(threads=n)
    own.pool = "own"
    assert (host.pool, own.pool) == ("host", "own")
    out_h, pools_h = _run_all(host)
    out_o, pools_o = _run_all(own)
    assert pools_h == ["host"] * len(pools_h), pools_h
    assert pools_o == ["own"] * len(pools_o), pools_o
    assert host.last()["threads"] >= 1
    for i, (a, b) in enumerate(zip(out_h, out_o)):
        assert torch.equal(a, b), f"output {i} differs between torch's pool and the own pool"


def test_default_context_of_a_new_thread():
    """A thread's default context, made after the import, is on torch's pool with torch's thread count."""
    seen = {}

    def body():
        q = randn(1, 8, 128, 64, seed=14)
        ft.scaled_dot_product_attention(q, q, q)
        c = flashattn.current_context()
        seen["pool"] = c.get(flashattn._C.PARAM_LAST_POOL)
        seen["threads"] = c.get(flashattn._C.PARAM_THREADS)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == {"pool": 1, "threads": torch.get_num_threads()}


def test_set_pool_switches_and_refuses():
    with pytest.raises(ValueError):
        ft.set_pool("both")
    with pytest.raises(ValueError):
        flashattn.Context().pool = "theirs"
    try:
        ft.set_pool("own")
        assert ft.pool_info()["pool"] == "own"
        ctx = flashattn.Context(threads=2)
        assert ctx.pool == "own"
        with ctx:
            q = randn(1, 8, 128, 64, seed=15)
            ft.scaled_dot_product_attention(q, q, q)
        assert ctx.last()["pool"] == "own"
        ctx.pool = "host"  # one context back on torch's pool
        with ctx:
            ft.scaled_dot_product_attention(q, q, q)
        assert ctx.last()["pool"] == "host"
    finally:
        ft.set_pool("host")
    assert flashattn.Context().pool == "host"


def _child(code, **env):
    e = dict(os.environ, FLASHATTN_VERBOSE="1", **env)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


_SDPA = ("import torch, flashattn.torch as ft\n"
         "q = torch.randn(1, 32, 256, 128)\n"
         "ft.scaled_dot_product_attention(q, q, q)\n")


def test_verbose_line_says_the_pool():
    lines = [ln for ln in _child(_SDPA).stderr.splitlines() if ln.startswith("flashattn_verbose,exec")]
    assert lines and all(",pool:host," in ln for ln in lines), lines
    lines = [ln for ln in _child(_SDPA, FLASHATTN_TORCH_POOL="own").stderr.splitlines()
             if ln.startswith("flashattn_verbose,exec")]
    assert lines and all(",pool:own," in ln for ln in lines), lines


def test_no_openmp_runtime_says_why():
    code = ("import flashattn\n"
            "rt = flashattn._C.omp_runtime()\n"
            "if rt['path']: print('loaded', rt['path']); raise SystemExit(0)\n"
            "assert 'no OpenMP runtime' in rt['why'], rt\n"
            "ctx = flashattn.Context()\n"
            "assert ctx.pool == 'own'\n"
            "try:\n"
            "    ctx.pool = 'host'\n"
            "except RuntimeError as e:\n"
            "    assert 'no OpenMP runtime' in str(e), e\n"
            "else:\n"
            "    raise AssertionError('a host pool without a runtime')\n"
            "print('refused')\n")
    r = _child(code)
    if r.stdout.startswith("loaded"):
        pytest.skip(f"an OpenMP runtime is loaded without torch here: {r.stdout.strip()}")
    assert r.stdout.strip() == "refused"
