"""test_inference.py: varlen, KV cache append then attend, paged and int8 caches, merge_states.

Each form is checked against the float64 formula on the equivalent dense problem
(sequence by sequence), and the cache contents after an append against what
docs/semantics.md, section 8 says must be stored.
"""

import numpy as np
import pytest

from conftest import assert_rule, attn_ref, needs_torch, randn, torch

pytestmark = needs_torch

if torch is not None:
    import flashattn
    from flashattn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, merge_states


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_varlen_forward_backward(dtype):
    dt = getattr(torch, dtype)
    cu_q = torch.tensor([0, 5, 5, 17], dtype=torch.int32)  # an empty sequence in the middle
    cu_k = torch.tensor([0, 9, 12, 30], dtype=torch.int32)
    q, k, v = randn(17, 4, 16, dtype=dt, seed=1), randn(30, 2, 16, dtype=dt, seed=2), randn(30, 2, 8, dtype=dt, seed=3)
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    out, lse, _ = flash_attn_varlen_func(qs, ks, vs, cu_q, cu_k, 12, 18, causal=True, return_attn_probs=True)
    assert out.shape == (17, 4, 8) and lse.shape == (4, 17)
    dout = randn(*out.shape, dtype=dt, seed=4)
    out.backward(dout)
    for b in range(3):
        a, e = int(cu_q[b]), int(cu_q[b + 1])
        c, f = int(cu_k[b]), int(cu_k[b + 1])
        if a == e:
            continue
        sl = (slice(a, e), slice(c, f))
        q64, k64, v64 = (x[s][None].double().requires_grad_() for x, s in ((q, sl[0]), (k, sl[1]), (v, sl[1])))
        ro, rl = attn_ref(q64, k64, v64, causal="bottom-right")
        ro.backward(dout[sl[0]][None].double())
        qn, kn, vn = (x[s][None].clone().requires_grad_() for x, s in ((q, sl[0]), (k, sl[1]), (v, sl[1])))
        no, nl = attn_ref(qn, kn, vn, causal="bottom-right", dtype=dt)
        no.backward(dout[sl[0]][None])
        assert_rule(out[sl[0]][None], ro.detach(), no.detach(), what=f"out seq {b}")
        assert_rule(lse[:, sl[0]][None], rl.detach(), nl.detach(), what=f"lse seq {b}")
        assert_rule(qs.grad[sl[0]][None], q64.grad, qn.grad, ulps=16, what=f"dq seq {b}")
        assert_rule(ks.grad[sl[1]][None], k64.grad, kn.grad, ulps=16, what=f"dk seq {b}")
        assert_rule(vs.grad[sl[1]][None], v64.grad, vn.grad, ulps=16, what=f"dv seq {b}")
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 18)


def test_varlen_numpy():
    cu = np.array([0, 3, 10], dtype=np.int32)
    q = randn(10, 2, 8, seed=5).numpy()
    out = flash_attn_varlen_func(q, q, q, cu, cu, 7, 7)
    assert isinstance(out, np.ndarray)
    for a, e in ((0, 3), (3, 10)):
        t = torch.from_numpy(q[a:e])[None].double()
        ref, _ = attn_ref(t, t, t)
        assert np.abs(out[a:e] - ref[0].numpy()).max() < 1e-6


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16", "float16"])
def test_kvcache_append_then_attend(cache_dtype):
    cdt = getattr(torch, cache_dtype)
    B, Bc, Smax, Hq, Hk, D, new = 2, 3, 32, 4, 2, 16, 3
    kc = randn(Bc, Smax, Hk, D, dtype=cdt, seed=10)
    vc = randn(Bc, Smax, Hk, D, dtype=cdt, seed=11)
    kc0, vc0 = kc.clone(), vc.clone()
    seqlens = torch.tensor([5, 11], dtype=torch.int32)
    bidx = torch.tensor([2, 0], dtype=torch.int32)
    q = randn(B, new, Hq, D, seed=12)
    kn, vn = randn(B, new, Hk, D, seed=13), randn(B, new, Hk, D, seed=14)
    out, lse = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, cache_batch_idx=bidx, causal=True,
                                       return_softmax_lse=True)
    for b in range(B):
        r, n = int(bidx[b]), int(seqlens[b])
        # appended in place, rounded to the cache dtype; nothing else touched
        assert torch.equal(kc[r, n:n + new], kn[b].to(cdt)) and torch.equal(vc[r, n:n + new], vn[b].to(cdt))
        assert torch.equal(kc[r, :n], kc0[r, :n]) and torch.equal(kc[r, n + new:], kc0[r, n + new:])
        keys, vals = kc[r, :n + new][None].double(), vc[r, :n + new][None].double()
        ro, rl = attn_ref(q[b:b + 1].double(), keys, vals, causal="bottom-right")
        no, _ = attn_ref(q[b:b + 1], keys.float(), vals.float(), causal="bottom-right", dtype=torch.float32)
        assert_rule(out[b:b + 1], ro, no, what=f"out {b}")
        assert (lse[b] - rl[0]).abs().max().item() < 1e-5
    assert torch.equal(kc[1], kc0[1])  # cache row 1 is nobody's
    # an append beyond S_max is refused before anything is written
    before = kc.clone()
    with pytest.raises(ValueError, match="fa_forward"):
        flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=torch.tensor([30, 1], dtype=torch.int32))
    assert torch.equal(kc, before)


def test_paged_cache_matches_contiguous():
    B, Hq, Hk, D, page, pages, maxp = 2, 4, 2, 8, 4, 12, 5
    lens = [13, 6]
    gen = torch.Generator().manual_seed(3)
    kpool, vpool = randn(pages, page, Hk, D, seed=20), randn(pages, page, Hk, D, seed=21)
    table = torch.randperm(pages, generator=gen)[:B * maxp].reshape(B, maxp).to(torch.int32)
    q = randn(B, 2, Hq, D, seed=22)
    kn, vn = randn(B, 2, Hk, D, seed=23), randn(B, 2, Hk, D, seed=24)
    out = flash_attn_with_kvcache(q, kpool, vpool, kn, vn, cache_seqlens=torch.tensor(lens, dtype=torch.int32),
                                  block_table=table, causal=True)
    for b in range(B):
        n = lens[b] + 2
        rows = [kpool[table[b, j // page], j % page] for j in range(n)]
        vrows = [vpool[table[b, j // page], j % page] for j in range(n)]
        keys, vals = torch.stack(rows)[None], torch.stack(vrows)[None]
        assert torch.equal(keys[0, lens[b]:], kn[b]) and torch.equal(vals[0, lens[b]:], vn[b])
        ro, _ = attn_ref(q[b:b + 1].double(), keys.double(), vals.double(), causal="bottom-right")
        no, _ = attn_ref(q[b:b + 1], keys, vals, causal="bottom-right", dtype=torch.float32)
        assert_rule(out[b:b + 1], ro, no, what=f"paged {b}")


def test_int8_cache_quantises_by_the_rule():
    Bc, Smax, Hk, D = 1, 16, 2, 8
    kc = torch.zeros(Bc, Smax, Hk, D, dtype=torch.int8)
    vc = torch.zeros(Bc, Smax, Hk, D, dtype=torch.int8)
    ks = torch.zeros(Bc, Smax, Hk)
    vs = torch.zeros(Bc, Smax, Hk)
    q = randn(1, 5, 4, D, seed=30)
    kn, vn = randn(1, 5, Hk, D, seed=31), randn(1, 5, Hk, D, seed=32)
    kn[0, 2, 1] = 0  # an all-zero row stores scale 0
    out = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=0, causal=True, k_scale=ks, v_scale=vs)
    for x, c, s in ((kn, kc, ks), (vn, vc, vs)):
        x = x[0].numpy()
        scale = np.abs(x).max(-1) / np.float32(127)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(scale > 0, np.float32(1) / scale, np.float32(0))
        q8 = np.clip(np.rint(x * inv[..., None]), -127, 127).astype(np.int8)
        np.testing.assert_array_equal(s[0, :5].numpy(), scale.astype(np.float32))
        np.testing.assert_array_equal(c[0, :5].numpy(), q8)
    kd = (kc[0, :5].float() * ks[0, :5, :, None])[None].double()
    vd = (vc[0, :5].float() * vs[0, :5, :, None])[None].double()
    ro, _ = attn_ref(q.double(), kd, vd, causal="bottom-right")
    no, _ = attn_ref(q, kd.float(), vd.float(), causal="bottom-right", dtype=torch.float32)
    assert_rule(out, ro, no, what="int8 cache")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("mode", ["per_token", "per_tensor", "descale"])
def test_fp8_cache(fmt, mode):
    # the rule written out: element = scale * fp8; a per-token append stores
    # scale = max|x| / FMAX and codes = x * (1 / scale) rounded to nearest even (torch's
    # cast, which agrees below FMAX); a shared scale is used as it is and never written
    dt, fmax = (torch.float8_e4m3fn, 448.0) if fmt == "e4m3" else (torch.float8_e5m2, 57344.0)
    B, Smax, Hk, Hq, D, old, new = 2, 24, 2, 4, 16, 7, 3
    kx, vx = randn(B, old, Hk, D, seed=40), randn(B, old, Hk, D, seed=41)
    kc, vc = torch.zeros(B, Smax, Hk, D, dtype=dt), torch.zeros(B, Smax, Hk, D, dtype=dt)
    if mode == "per_token":
        ks, vs = torch.full((B, Smax, Hk), 0.01), torch.full((B, Smax, Hk), 0.02)
        kw = {"k_scale": ks, "v_scale": vs}
    elif mode == "per_tensor":
        ks, vs = torch.full((B, Smax, Hk), 0.01), torch.full((B, Smax, Hk), 0.02)
        kw = {"k_scale": 0.01, "v_scale": 0.02}
    else:
        ks, vs = torch.full((B, Smax, Hk), 0.01), torch.full((B, Smax, Hk), 0.02)
        kw = {"k_descale": torch.full((B, Hk), 0.01), "v_descale": torch.full((B, Hk), 0.02)}
    kc[:, :old] = (kx / 0.01).to(dt)
    vc[:, :old] = (vx / 0.02).to(dt)
    q = randn(B, 1, Hq, D, seed=42)
    kn, vn = randn(B, new, Hk, D, seed=43), randn(B, new, Hk, D, seed=44)
    out = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=old, causal=True, **kw)
    for x, c, s in ((kn, kc, ks), (vn, vc, vs)):
        if mode == "per_token":
            want_s = x.abs().amax(-1) / torch.tensor(fmax, dtype=torch.float32)
            assert torch.equal(s[:, old:old + new], want_s)
        want_s = s[:, old:old + new]
        inv = torch.where(want_s > 0, 1 / want_s, torch.zeros_like(want_s))
        want = (x * inv[..., None]).to(dt)
        if mode != "per_token":
            want = torch.clamp(x * inv[..., None], -fmax, fmax).to(dt)  # saturating
        assert torch.equal(c[:, old:old + new].view(torch.uint8), want.view(torch.uint8))
    n = old + new
    kd = kc[:, :n].double() * ks[:, :n, :, None].double()
    vd = vc[:, :n].double() * vs[:, :n, :, None].double()
    ro, _ = attn_ref(q.double(), kd, vd, causal="bottom-right")
    no, _ = attn_ref(q, kd.float(), vd.float(), causal="bottom-right", dtype=torch.float32)
    assert_rule(out, ro, no, what=f"fp8 {fmt} {mode}")


def test_merge_states_equals_whole():
    q, k, v = randn(2, 7, 4, 16, seed=40), randn(2, 30, 2, 16, seed=41), randn(2, 30, 2, 8, seed=42)
    o1, l1, _ = flash_attn_func(q, k[:, :12], v[:, :12], return_attn_probs=True)
    o2, l2, _ = flash_attn_func(q, k[:, 12:], v[:, 12:], return_attn_probs=True)
    o, lse = merge_states([o1, o2], [l1, l2])
    ro, rl = attn_ref(q.double(), k.double(), v.double())
    assert (o.double() - ro).abs().max().item() < 2e-6
    assert (lse.double() - rl).abs().max().item() < 2e-6
    on, ln = merge_states([o1.numpy(), o2.numpy()], [l1.numpy(), l2.numpy()])
    assert np.array_equal(on, o.numpy()) and np.array_equal(ln, lse.numpy())


def test_kvcache_numpy_in_numpy_out():
    kc = np.zeros((1, 8, 1, 4), np.float32)
    vc = np.zeros((1, 8, 1, 4), np.float32)
    q = randn(1, 1, 2, 4, seed=50).numpy()
    kn, vn = randn(1, 3, 1, 4, seed=51).numpy(), randn(1, 3, 1, 4, seed=52).numpy()
    out = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=2)
    assert isinstance(out, np.ndarray) and np.array_equal(kc[0, 2:5], kn[0]) and not kc[0, 5:].any()
    ref, _ = attn_ref(torch.from_numpy(q).double(), torch.from_numpy(kc[:, :5]).double(),
                      torch.from_numpy(vc[:, :5]).double())
    assert np.abs(out - ref.numpy()).max() < 1e-6


def test_short_index_arrays_are_refused_not_read_past():
    q = randn(2, 1, 2, 4, seed=60)
    kc, vc = torch.zeros(2, 8, 1, 4), torch.zeros(2, 8, 1, 4)
    with pytest.raises(ValueError, match="cache_seqlens has 1 entries for a batch of 2"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor([3], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_batch_idx"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=1, cache_batch_idx=torch.tensor([0], dtype=torch.int32))
    with pytest.raises(ValueError, match="block_table"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=1, block_table=torch.zeros(1, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="alibi_slopes"):
        flash_attn_func(q, kc[:, :3], vc[:, :3], alibi_slopes=torch.ones(1))
    with pytest.raises(ValueError, match="int32"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor([1.0, 2.0]))


def test_kvcache_decode_path_matches_the_general_path():
    """flash_attn_with_kvcache's per-call path (_C.kvcache_torch, lenient: CPU torch tensors and
    int32 index arrays taken as they come, in one binding call) gives the general path's bits, and
    hands everything it does not take to the general path before writing anything, so that the
    general path's conversions and messages still hold."""
    B, Smax, Hq, Hk, D = 2, 16, 4, 2, 8
    q = randn(B, 1, Hq, D, seed=70)
    kn, vn = randn(B, 1, Hk, D, seed=71), randn(B, 1, Hk, D, seed=72)
    kc0, vc0 = randn(B, Smax, Hk, D, seed=73), randn(B, Smax, Hk, D, seed=74)
    sl = torch.tensor([3, 9], dtype=torch.int32)

    def run(q=q, seqlens=sl, **kw):
        kc, vc = kc0.clone(), vc0.clone()
        return flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, causal=True, **kw), kc, vc

    (ref, _), kref, vref = run(return_softmax_lse=True)  # the general path
    for b in range(B):  # what it wrote and computed, against the float64 formula
        n = int(sl[b])
        assert torch.equal(kref[b, n], kn[b, 0]) and torch.equal(vref[b, n], vn[b, 0])
        ro, _ = attn_ref(q[b:b + 1].double(), kref[b:b + 1, :n + 1].double(), vref[b:b + 1, :n + 1].double(),
                         causal="bottom-right")
        assert (ref[b] - ro[0]).abs().max().item() < 1e-5
    import flashattn.torch  # noqa: F401  (hands torch's functions to the binding, as a first torch call does)

    ctx = flashattn._core.current_context()

    def lenient(q=q, seqlens=sl, kc=None):
        kc = kc0.clone() if kc is None else kc
        return flashattn._C.kvcache_torch(ctx, q, kc, vc0.clone(), kn, vn, seqlens, None, None, None, None, None,
                                          flashattn._core.Options(causal=1), True), kc

    out, kc = lenient()
    assert out is not None and torch.equal(out, ref) and torch.equal(kc, kref)
    # refused before anything is written: what the general path converts, or words its own way
    strided = torch.tensor([3, 0, 9, 0], dtype=torch.int32)[::2]
    for kw in ({"seqlens": 3}, {"seqlens": sl.long()}, {"seqlens": strided}, {"seqlens": None},
               {"q": q.numpy()}, {"q": q[0]}, {"q": q.to("meta")}):
        out, kc = lenient(**kw)
        assert out is None and torch.equal(kc, kc0), kw
    # through the API, each form gives the same bits
    for s in (sl.long(), strided):
        out, kc, vc = run(seqlens=s)
        assert torch.equal(out, ref) and torch.equal(kc, kref) and torch.equal(vc, vref)
    out, kc, vc = run(q=q.clone().requires_grad_())
    assert torch.equal(out, ref) and not out.requires_grad and torch.equal(kc, kref)
    same, _, _ = run(seqlens=torch.tensor([5, 5], dtype=torch.int32))
    out, _, _ = run(seqlens=5)
    assert torch.equal(out, same)
    with pytest.raises(ValueError, match=r"q must be 4-d \(batch"):
        run(q=q[0])
    with pytest.raises(ValueError, match="cache_seqlens is required"):
        run(seqlens=None)
    with pytest.raises(ValueError, match="q is on meta"):
        run(q=q.to("meta"))


def test_kv_splits_reaches_every_layer_from_the_table():
    # an option appended to the C table is a member of Options (with its C default), a
    # keyword of the binding and an argument of both torch ops, with no line of them changed
    import flashattn.torch  # noqa: F401  (defines the ops)

    opts = flashattn._core.Options()
    assert opts.kv_splits == 0 and "kv_splits" in flashattn._core.Options.__doc__
    fwd = str(torch.ops.flashattn.fwd.default._schema)
    bwd = str(torch.ops.flashattn.bwd.default._schema)
    assert "int kv_splits=0" in fwd and "int kv_splits=0" in bwd, (fwd, bwd)
    q = randn(1, 4, 2, 16, seed=86)
    with pytest.raises(ValueError, match="kv_splits"):
        torch.ops.flashattn.fwd(q, q, q, kv_splits=300)
    out = torch.empty_like(q)
    with pytest.raises(ValueError, match="kv_splits"):
        flashattn._C.forward(flashattn.current_context(), q.numpy(), q.numpy(), q.numpy(), out.numpy(), kv_splits=-1)


def test_kv_splits_per_call_is_the_contexts_setting_bitwise():
    # a decoding call through the binding (Options and the torch op): kv_splits = s gives
    # the bits of the context's FA_PARAM_KV_SPLITS = s whatever that setting is, and
    # leaves it as it was
    import flashattn.torch  # noqa: F401  (defines the ops)

    B, L, Hq, Hk, D = 2, 700, 8, 2, 32
    q = randn(B, 1, Hq, D, seed=81)
    k, v = randn(B, L, Hk, D, seed=82), randn(B, L, Hk, D, seed=83)
    ctx = flashattn.Context(threads=2)
    with ctx:
        for splits in (1, 2, 5, 16):
            ctx._c.set(flashattn._C.PARAM_KV_SPLITS, splits)
            want = torch.ops.flashattn.fwd(q, k, v, causal=1)[0]
            for setting in (0, 3):
                ctx._c.set(flashattn._C.PARAM_KV_SPLITS, setting)
                got = torch.ops.flashattn.fwd(q, k, v, causal=1, kv_splits=splits)[0]
                assert torch.equal(got, want), (splits, setting)
                opts = flashattn._core.Options(causal=1, kv_splits=splits)
                out = torch.empty_like(want)
                flashattn._C.forward(ctx._c, q.numpy(), k.numpy(), v.numpy(), out.numpy(), opts=opts)
                assert torch.equal(out, want), (splits, setting)
                assert ctx._c.get(flashattn._C.PARAM_KV_SPLITS) == setting
        ctx._c.set(flashattn._C.PARAM_KV_SPLITS, 0)


@pytest.mark.parametrize("lse", [False, True])  # the per-call path and the general one
def test_num_splits_is_the_calls_own_split_count(lse):
    # fa_forward_args.kv_splits, reached from flash_attn_with_kvcache's num_splits: the
    # bits of the context's FA_PARAM_KV_SPLITS set to the same count, whatever the
    # context's setting, which the call leaves as it was; out of range is a ValueError
    B, L, Hq, Hk, D = 2, 700, 8, 2, 32
    q = randn(B, 1, Hq, D, seed=81)
    kc0, vc0 = randn(B, L + 1, Hk, D, seed=82), randn(B, L + 1, Hk, D, seed=83)
    kn, vn = randn(B, 1, Hk, D, seed=84), randn(B, 1, Hk, D, seed=85)
    seqlens = torch.full((B,), L, dtype=torch.int32)
    ctx = flashattn.Context(threads=2)

    def call(num_splits):
        out = flash_attn_with_kvcache(q, kc0.clone(), vc0.clone(), kn, vn, cache_seqlens=seqlens, causal=True,
                                      num_splits=num_splits, return_softmax_lse=lse)
        return out[0] if lse else out

    with ctx:
        for splits in (1, 2, 5, 16):
            ctx._c.set(flashattn._C.PARAM_KV_SPLITS, splits)
            want = call(0)
            for context_setting in (0, 3):
                ctx._c.set(flashattn._C.PARAM_KV_SPLITS, context_setting)
                got = call(splits)
                assert torch.equal(got, want), (splits, context_setting)
                assert ctx._c.get(flashattn._C.PARAM_KV_SPLITS) == context_setting
        ctx._c.set(flashattn._C.PARAM_KV_SPLITS, 0)
        for bad in (-1, 257):
            with pytest.raises(ValueError, match="kv_splits"):
                call(bad)
