"""test_numpy.py: the package without torch: install, NumPy in and out, contexts, errors.

The NumPy oracle is an explicit float64 formula (einsum), independent of torch.
"""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import flashattn

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def np_ref(q, k, v, causal=False, scale=None, mask=None, bias=None):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hk, axis=2)
    v = np.repeat(v, H // Hk, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) * (scale or 1 / np.sqrt(D))
    if bias is not None:
        s = s + bias
    keep = np.ones(s.shape, dtype=bool)
    if mask is not None:
        keep &= mask
    if causal:
        i = np.arange(Sq)[:, None]
        j = np.arange(Sk)[None]
        keep &= j <= i + Sk - Sq
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    return np.einsum("bhij,bjhd->bihd", p / l, v), (np.log(l) + m)[..., 0]


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_installed_package_not_source_tree():
    # the tests must exercise what pip installed, not python/flashattn in the clone
    assert not os.path.abspath(flashattn.__file__).startswith(os.path.join(REPO, "python")), flashattn.__file__
    assert flashattn._C.__file__.endswith(".so")
    assert flashattn.__version__.count(".") == 2


def test_import_without_torch():
    code = (
        "import sys, numpy as np, flashattn\n"
        "q = np.ones((1, 4, 2, 8), np.float32)\n"
        "o = flashattn.flash_attn_func(q, q, q, causal=True)\n"
        "assert o.shape == (1, 4, 2, 8) and isinstance(o, np.ndarray)\n"
        "assert 'torch' not in sys.modules, 'flashattn imported torch'\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.path.dirname(__file__))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.parametrize("causal", [False, True])
def test_numpy_forward_gqa(causal):
    q, k, v = rnd(2, 33, 4, 16, seed=1), rnd(2, 47, 2, 16, seed=2), rnd(2, 47, 2, 24, seed=3)
    out, lse, dm = flashattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    ro, rl = np_ref(q, k, v, causal=causal)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (2, 33, 4, 24)
    assert dm is None
    np.testing.assert_allclose(out, ro, atol=2e-6, rtol=0)
    np.testing.assert_allclose(lse, rl, atol=2e-6, rtol=0)


def test_numpy_any_strides_zero_copy():
    # a BNSD buffer seen as BSND, a reversed axis, a slice: strides go to the library as they are
    base = rnd(2, 4, 40, 16, seed=4)
    q = base.transpose(0, 2, 1, 3)[:, ::-1]
    k = rnd(2, 60, 4, 32, seed=5)[:, ::2, :, 8:24]
    v = np.asfortranarray(rnd(2, 30, 4, 16, seed=6))
    assert not q.flags.c_contiguous and not k.flags.c_contiguous
    out = flashattn.flash_attn_func(q, k, v)
    np.testing.assert_allclose(out, np_ref(q, k, v)[0], atol=2e-6, rtol=0)


def test_kv_pack_modes_same_bits():
    # f16 K/V widen to f32 once per (sequence, kv head) when packed: auto packs here
    # (five 128-row query blocks read each kv head), never does not, always does; same bits
    q, k, v = (rnd(1, 600, 4, 32, seed=s).astype(np.float16) for s in (20, 21, 22))
    outs, packed = [], []
    for mode in ("never", "auto", "always"):
        with flashattn.Context(threads=2) as ctx:
            ctx.kv_pack = mode
            assert ctx.kv_pack == mode
            outs.append(flashattn.flash_attn_func(q, k, v, causal=True))
            packed.append(ctx.last()["kv_packed"])
            packed.append(ctx.last()["kv_pack_us"] > 0)
    assert packed == [0, False, 4, True, 4, True], packed
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    np.testing.assert_allclose(outs[0].astype(np.float64), np_ref(q, k, v, causal=True)[0], atol=2e-3, rtol=0)
    with pytest.raises(ValueError, match="kv_pack must be"):
        flashattn.Context().kv_pack = "sometimes"


def test_numpy_read_only_and_broadcast_inputs():
    q = rnd(1, 8, 2, 16, seed=7)
    k = np.broadcast_to(rnd(1, 1, 2, 16, seed=8), (1, 12, 2, 16))  # stride 0, read-only
    q.setflags(write=False)
    out = flashattn.flash_attn_func(q, k, k)
    np.testing.assert_allclose(out, np_ref(q, k, k)[0], atol=2e-6, rtol=0)


def test_numpy_masks():
    q, k, v = rnd(2, 9, 2, 8, seed=9), rnd(2, 11, 2, 8, seed=10), rnd(2, 11, 2, 8, seed=11)
    mask = np.random.default_rng(1).random((2, 1, 9, 11)) < 0.7
    mask[..., 0] = True
    bias = rnd(9, 11, seed=12)
    np.testing.assert_allclose(flashattn.flash_attn_func(q, k, v, attn_mask=mask), np_ref(q, k, v, mask=mask)[0],
                               atol=2e-6, rtol=0)
    np.testing.assert_allclose(flashattn.flash_attn_func(q, k, v, attn_mask=bias), np_ref(q, k, v, bias=bias)[0],
                               atol=3e-6, rtol=0)


def test_context_with_block_and_reference_algo():
    q = rnd(1, 16, 2, 8, seed=13)
    with flashattn.Context(threads=1, algo="reference") as ctx:
        assert ctx.algo == "reference" and ctx.threads == 1
        assert flashattn.current_context() is ctx._c
        out = flashattn.flash_attn_func(q, q, q)
        assert ctx.last()["algo"] == "reference"
    assert flashattn.current_context() is not ctx._c
    np.testing.assert_allclose(out, np_ref(q, q, q)[0], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="algo must be"):
        flashattn.Context(algo="fastest")
    ctx.close()
    with pytest.raises(ValueError, match="closed"):
        ctx.threads


# ---------------------------------------------------------------- errors: the right class and the library's words

def test_error_shape_mismatch_says_what():
    q = rnd(1, 8, 2, 16)
    with pytest.raises(ValueError, match="head dims differ"):
        flashattn.flash_attn_func(q, q[..., :8], q)
    with pytest.raises(ValueError, match="4-d"):
        flashattn.flash_attn_func(q[0], q[0], q[0])
    with pytest.raises(ValueError):  # 3 query heads over 2 kv heads
        flashattn.flash_attn_func(rnd(1, 8, 3, 16), q, q)


def test_error_dtype_and_arguments():
    q = rnd(1, 8, 2, 16)
    with pytest.raises(ValueError, match="unsupported dtype"):
        flashattn.flash_attn_func(q.astype(np.float64), q, q)
    with pytest.raises(ValueError, match="dtype"):
        flashattn.flash_attn_func(q.astype(np.float16), q, q)
    with pytest.raises(ValueError, match="dropout_p"):
        flashattn.flash_attn_func(q, q, q, dropout_p=1.0)
    with pytest.raises(ValueError, match="window_size"):
        flashattn.flash_attn_func(q, q, q, window_size=(-2, 0))
    with pytest.raises(ValueError, match="softmax_scale"):
        flashattn.flash_attn_func(q, q, q, softmax_scale=0.0)
    with pytest.raises(ValueError, match="causal"):
        flashattn.flash_attn_func(q, q, q, causal="sideways")
    with pytest.raises(TypeError, match="expected an array"):
        flashattn._C.forward(flashattn.current_context(), q, q, q, "not an array")


def test_error_overflow_is_valueerror_not_a_crash():
    # extents of 2^40 with stride 0: the size products overflow int64, which the library refuses
    big = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=(2**20, 2**20, 2**10, 64),
                                          strides=(0, 0, 0, 0), writeable=True)
    with pytest.raises(ValueError, match="fa_forward"):
        flashattn._C.forward(flashattn.current_context(), big, big, big, big)


def test_busy_context_is_runtimeerror():
    # One Context entered on two threads at once: the library answers FA_ERR_BUSY,
    # which must come out as RuntimeError naming the cause, never a crash or a race.
    ctx = flashattn.Context(threads=1)
    q = rnd(1, 256, 4, 64, seed=14)
    errors, done = [], []

    def run():
        with ctx:
            for _ in range(20):
                try:
                    flashattn.flash_attn_func(q, q, q)
                    done.append(1)
                except RuntimeError as e:
                    errors.append(str(e))

    ts = [threading.Thread(target=run) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(done) + len(errors) == 40 and done
    assert all("busy" in e.lower() or "in use" in e.lower() for e in errors), errors[:1]


def test_out_of_memory_is_memoryerror():
    # the standard algorithm materialises the 2^20 x 2^20 scores of a head (4 TiB):
    # the allocation fails before any work, and the call says so
    big = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=(1, 2**20, 1, 64), strides=(0, 0, 0, 0),
                                          writeable=True)
    ctx = flashattn.Context(threads=1, algo="standard")
    with pytest.raises(MemoryError, match="out of memory.*cannot allocate"):
        flashattn._C.forward(ctx._c, big, big, big, big)


def test_unsupported_form_is_notimplemented_runtimeerror():
    # the standard baseline has no varlen form: the library says so
    q = rnd(10, 2, 8, seed=15)
    cu = np.array([0, 4, 10], dtype=np.int32)
    with flashattn.Context(threads=1, algo="standard"):
        with pytest.raises(NotImplementedError, match="fa_forward: .*standard"):
            flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6)
    assert issubclass(NotImplementedError, RuntimeError)
