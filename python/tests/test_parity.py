"""test_parity.py: the flash-attn keywords that used to raise ValueError.

flash_attn_varlen_func(block_table=...) (paged keys), flash_attn_with_kvcache's
cache_leftpad, rotary_cos / rotary_sin (interleaved and not) and cache_seqlens as an
int or a tensor, and return_attn_probs in flash-attn's S_dmask encoding. Each is
checked against torch's math SDPA in float64 on the equivalent dense problem, with
the rule flash-attn documents written out here (rotary, leftpad, the page lookup,
the sign-bit encoding), and bad input against ValueError.
"""

import math

import numpy as np
import pytest

from conftest import assert_rule, attn_ref, dropout_keep_rule, needs_torch, randn, torch

pytestmark = needs_torch

if torch is not None:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashattn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache


def sdpa64(q, k, v, causal=False, window=(-1, -1)):
    """torch's math SDPA in float64 on BSND q (1, Sq, Hq, D), k, v (1, Sk, Hk, ..), with
    flash-attn's bottom-right causal / window as an explicit bool mask."""
    Sq, Sk, g = q.shape[1], k.shape[1], q.shape[2] // k.shape[2]
    i, j = torch.arange(Sq)[:, None], torch.arange(Sk)[None, :]
    d = i + Sk - Sq
    keep = torch.ones(Sq, Sk, dtype=torch.bool)
    if causal:
        keep &= j <= d
    if window[0] >= 0:
        keep &= j >= d - window[0]
    if window[1] >= 0:
        keep &= j <= d + window[1]
    qh = q.double().transpose(1, 2)
    kh = k.double().transpose(1, 2).repeat_interleave(g, dim=1)
    vh = v.double().transpose(1, 2).repeat_interleave(g, dim=1)
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=keep)
    return torch.nan_to_num(o.transpose(1, 2), nan=0.0)  # an empty row: SDPA's NaN, ours 0


def check(got, q, k, v, dt, causal=False, window=(-1, -1), what="out"):
    ref = sdpa64(q, k, v, causal, window)
    naive, _ = attn_ref(q, k, v, causal="bottom-right" if causal else None, window=window, dtype=dt)
    assert_rule(got, ref, naive.to(torch.float64), what=what)


# ------------------------------------------------------------ varlen + block_table


def paged(lens, Hk, D, page_size, dt, seed):
    """A shuffled page pool holding sequences of the given lengths, its block table, and
    each sequence's keys and values as dense (1, len, Hk, D) tensors."""
    gen = torch.Generator().manual_seed(seed)
    need = [(n + page_size - 1) // page_size for n in lens]
    pages = sum(need) + 2
    kp, vp = randn(pages, page_size, Hk, D, dtype=dt, seed=seed), randn(pages, page_size, Hk, D, dtype=dt, seed=seed + 1)
    order = torch.randperm(pages, generator=gen).to(torch.int32)
    table = torch.full((len(lens), max(need) + 1), pages - 1, dtype=torch.int32)
    at, ks, vs = 0, [], []
    for b, n in enumerate(lens):
        table[b, : need[b]] = order[at : at + need[b]]
        at += need[b]
        rows = torch.arange(n)
        ids = table[b, rows // page_size].long()
        ks.append(kp[ids, rows % page_size][None])  # key j: row j % page_size of page table[b, j // page_size]
        vs.append(vp[ids, rows % page_size][None])
    return kp, vp, table, ks, vs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("page_size", [1, 16, 5])
def test_varlen_block_table(dtype, page_size):
    dt = getattr(torch, dtype)
    lens_q, lens_k = [7, 1, 1, 0, 33], [40, 17, 1, 5, 33]  # a chunk, two decodes, an empty q, a prefill
    kp, vp, table, ks, vs = paged(lens_k, 2, 16, page_size, dt, seed=10)
    cu_q = torch.tensor(np.cumsum([0] + lens_q), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + lens_k), dtype=torch.int32)
    q = randn(int(cu_q[-1]), 4, 16, dtype=dt, seed=11)
    for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (False, (6, 0))):
        out, lse, none = flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 33, 40, causal=causal, window_size=window,
                                                block_table=table, return_attn_probs=True)
        assert out.shape == q.shape and lse.shape == (4, q.shape[0]) and none is None
        for b in range(len(lens_q)):
            rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
            check(out[rows][None], q[rows][None], ks[b], vs[b], dt, causal, window, what=f"seq {b} causal={causal}")
    # NumPy gives the same bits; seqused_k overrides cu_seqlens_k's lengths
    out = flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 33, 40, causal=True, block_table=table)
    if dt != torch.bfloat16:
        got = flash_attn_varlen_func(q.numpy(), kp.numpy(), vp.numpy(), cu_q.numpy(), cu_k.numpy(), 33, 40,
                                     causal=True, block_table=table.numpy())
        assert np.array_equal(got, out.numpy())
    used = torch.tensor([40, 3, 1, 5, 20], dtype=torch.int32)
    got = flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 33, 40, causal=True, block_table=table, seqused_k=used)
    for b in (1, 4):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        n = int(used[b])
        check(got[rows][None], q[rows][None], ks[b][:, :n], vs[b][:, :n], dt, True, what=f"seqused_k seq {b}")


def test_varlen_block_table_errors():
    kp, vp, table, _, _ = paged([20, 9], 1, 8, 4, torch.float32, seed=3)
    q = randn(4, 2, 8, seed=4)
    cu_q = torch.tensor([0, 3, 4], dtype=torch.int32)
    cu_k = torch.tensor([0, 20, 29], dtype=torch.int32)
    # a block table too short for a chunk: 20 keys need 5 pages of 4 rows
    with pytest.raises(ValueError, match="overflow|pages|rows"):
        flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 3, 20, block_table=table[:, :4].contiguous())
    with pytest.raises(ValueError, match="page id|block_table"):
        bad = table.clone()
        bad[0, 1] = 999
        flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 3, 20, block_table=bad)
    with pytest.raises(ValueError, match="block_table must be"):
        flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 3, 20, block_table=table[:1])
    with pytest.raises(ValueError, match="num_pages"):
        flash_attn_varlen_func(q, kp[0], vp[0], cu_q, cu_k, 3, 20, block_table=table)
    with pytest.raises(ValueError, match="dropout"):
        flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 3, 20, dropout_p=0.1, block_table=table)
    with pytest.raises(ValueError, match="seqused_k"):
        flash_attn_varlen_func(q, q, q, cu_q, cu_q, 3, 3, seqused_k=torch.tensor([1, 1], dtype=torch.int32))


# ------------------------------------------------------------ KV cache keywords


def rotary_ref(x, cos, sin, pos, interleaved):
    """The rotary embedding flash-attn documents, written out: x (B, S, H, D) at positions
    pos (B, S); pairs (2i, 2i+1) interleaved, else (i, i + rd/2); in fp32, rounded to x's dtype."""
    rd = 2 * cos.shape[1]
    out = x.clone()
    xf = x.float()
    for b in range(x.shape[0]):
        for s in range(x.shape[1]):
            c, sn = cos[pos[b][s]].float(), sin[pos[b][s]].float()
            for i in range(rd // 2):
                a, e = (2 * i, 2 * i + 1) if interleaved else (i, i + rd // 2)
                x1, x2 = xf[b, s, :, a], xf[b, s, :, e]
                out[b, s, :, a] = (x1 * c[i] - x2 * sn[i]).to(x.dtype)
                out[b, s, :, e] = (x1 * sn[i] + x2 * c[i]).to(x.dtype)
    return out


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_kvcache_rotary(interleaved, causal):
    dt = torch.float16
    B, Sq, Snew, S_max, Hq, Hk, D, rd = 2, 3, 3, 40, 4, 2, 32, 16
    kc, vc = randn(B, S_max, Hk, D, dtype=dt, seed=1), randn(B, S_max, Hk, D, dtype=dt, seed=2)
    q, k, v = randn(B, Sq, Hq, D, dtype=dt, seed=3), randn(B, Snew, Hk, D, dtype=dt, seed=4), randn(B, Snew, Hk, D, dtype=dt, seed=5)
    angle = torch.arange(S_max)[:, None].double() / (100.0 ** (torch.arange(rd // 2)[None, :] / (rd // 2)))
    cos, sin = angle.cos().to(dt), angle.sin().to(dt)
    seqlens = torch.tensor([9, 30], dtype=torch.int32)
    k0, v0 = kc.clone(), vc.clone()
    out = flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
                                  causal=causal, rotary_interleaved=interleaved)
    for b in range(B):
        n = int(seqlens[b])
        kpos = [[n + i for i in range(Snew)]]
        qpos = [[n + (i if causal else 0) for i in range(Sq)]]
        kr = rotary_ref(k[b : b + 1], cos, sin, kpos, interleaved)
        qr = rotary_ref(q[b : b + 1], cos, sin, qpos, interleaved)
        assert torch.equal(kc[b, n : n + Snew], kr[0]), "the cache holds the rotated new keys"
        assert torch.equal(vc[b, n : n + Snew], v[b]), "values are not rotated"
        assert torch.equal(kc[b, :n], k0[b, :n]) and torch.equal(kc[b, n + Snew :], k0[b, n + Snew :])
        keys, vals = kc[b : b + 1, : n + Snew], vc[b : b + 1, : n + Snew]
        check(out[b : b + 1], qr, keys, vals, dt, causal, what=f"rotary seq {b}")
    # errors: rotary without new rows, a table too short for the positions
    kc[:], vc[:] = k0, v0
    with pytest.raises(ValueError, match="rotary"):
        flash_attn_with_kvcache(q, kc, vc, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens)
    with pytest.raises(ValueError, match="rotary_cos has"):
        flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos[:20], rotary_sin=sin[:20], cache_seqlens=seqlens)
    assert torch.equal(kc, k0) and torch.equal(vc, v0), "a refused call wrote the cache"


def test_kvcache_rotary_numpy_matches_torch():
    dt = torch.float32
    q, k, v = randn(1, 2, 2, 16, seed=6), randn(1, 2, 1, 16, seed=7), randn(1, 2, 1, 16, seed=8)
    kc, vc = randn(1, 10, 1, 16, seed=9), randn(1, 10, 1, 16, seed=10)
    cos, sin = randn(12, 4, seed=11), randn(12, 4, seed=12)
    kn, vn = kc.numpy().copy(), vc.numpy().copy()
    a = flash_attn_with_kvcache(q, kc, vc, k, v, cos, sin, cache_seqlens=5, causal=True, rotary_interleaved=False)
    b = flash_attn_with_kvcache(q.numpy(), kn, vn, k.numpy(), v.numpy(), cos.numpy(), sin.numpy(), cache_seqlens=5,
                                causal=True, rotary_interleaved=False)
    assert np.array_equal(a.numpy(), b) and np.array_equal(kc.numpy(), kn)
    assert dt == a.dtype


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kvcache_leftpad(dtype):
    dt = getattr(torch, dtype)
    B, Sq, Hq, Hk, D, S_max = 3, 2, 4, 2, 16, 30
    kc, vc = randn(B, S_max, Hk, D, dtype=dt, seed=1), randn(B, S_max, Hk, D, dtype=dt, seed=2)
    kc[0, :4] = float("nan")  # padding is never read
    q, k, v = randn(B, Sq, Hq, D, dtype=dt, seed=3), randn(B, Sq, Hk, D, dtype=dt, seed=4), randn(B, Sq, Hk, D, dtype=dt, seed=5)
    seqlens = torch.tensor([12, 20, 7], dtype=torch.int32)
    leftpad = torch.tensor([4, 0, 7], dtype=torch.int32)  # the last: nothing cached but the new rows
    for causal in (True, False):
        kw, vw = kc.clone(), vc.clone()
        out = flash_attn_with_kvcache(q, kw, vw, k, v, cache_seqlens=seqlens, cache_leftpad=leftpad, causal=causal)
        for b in range(B):
            lp, n = int(leftpad[b]), int(seqlens[b])
            assert torch.equal(kw[b, n : n + Sq], k[b]) and torch.equal(vw[b, n : n + Sq], v[b])
            keys, vals = kw[b : b + 1, lp : n + Sq], vw[b : b + 1, lp : n + Sq]
            check(out[b : b + 1], q[b : b + 1], keys, vals, dt, causal, what=f"leftpad seq {b} causal={causal}")
    # cache_seqlens as an int, and as a tensor of that int, give the same bits
    a = flash_attn_with_kvcache(q, kc.clone(), vc.clone(), k, v, cache_seqlens=9, cache_leftpad=leftpad, causal=True)
    b = flash_attn_with_kvcache(q, kc.clone(), vc.clone(), k, v, cache_seqlens=torch.full((B,), 9, dtype=torch.int32),
                                cache_leftpad=leftpad, causal=True)
    assert torch.equal(a, b)
    # errors, nothing written
    k0 = kc.clone()
    with pytest.raises(ValueError, match="leftpad"):
        flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, cache_leftpad=torch.tensor([4, 0, 8],
                                                                                                   dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_leftpad has"):
        flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, cache_leftpad=leftpad[:2])
    table = torch.zeros((B, 2), dtype=torch.int32)
    with pytest.raises(ValueError, match="leftpad"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, cache_leftpad=leftpad, block_table=table)
    assert torch.equal(kc.view(torch.uint8), k0.view(torch.uint8)), "a refused call wrote the cache"


# ------------------------------------------------------------ return_attn_probs


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_attn_probs_encoding(dtype):
    dt = getattr(torch, dtype)
    B, Sq, Sk, Hq, Hk, D, p, seed = 2, 9, 150, 4, 2, 16, 0.3, 1234
    q, k, v = randn(B, Sq, Hq, D, dtype=dt, seed=1), randn(B, Sk, Hk, D, dtype=dt, seed=2), randn(B, Sk, Hk, D, dtype=dt, seed=3)
    window = (40, 0)
    out, lse, S = flash_attn_func(q, k, v, dropout_p=p, causal=True, window_size=window, return_attn_probs=True,
                                  dropout_seed=seed)
    assert S.shape == (B, Hq, 128, 256) and S.dtype == dt
    assert not S[:, :, Sq:].any() and not S[:, :, :, Sk:].any(), "the padding is zero"
    S = S[:, :, :Sq, :Sk]
    keep = ~torch.signbit(S)
    assert np.array_equal(keep.numpy(), dropout_keep_rule(B, Hq, Sq, Sk, p, seed, 0))
    # |S| is softmax(scale q k^T) over the kept band, from SDPA's math in float64
    g = Hq // Hk
    sc = (q.double().transpose(1, 2) @ k.double().transpose(1, 2).repeat_interleave(g, 1).transpose(-1, -2))
    i, j = torch.arange(Sq)[:, None], torch.arange(Sk)[None, :]
    d = i + Sk - Sq
    band = (j <= d) & (j >= d - window[0])
    ref = torch.softmax((sc / math.sqrt(D)).masked_fill(~band, float("-inf")), -1)
    err = (S.abs().double() - ref).abs().max().item()
    assert err <= (1e-6 if dt == torch.float32 else 2e-3), err
    assert (S.abs()[..., ~band] == 0).all()
    # flash-attn's tests read the mask as S >= 0 inside the band: the same bits there
    assert torch.equal((S >= 0)[..., band], keep[..., band])
    # the output is the dropped probabilities times v, as the encoding says
    ro, _ = attn_ref(q.double(), k.double(), v.double(), causal="bottom-right", window=window, keep=keep, dropout_p=p)
    no, _ = attn_ref(q, k, v, causal="bottom-right", window=window, keep=keep, dropout_p=p, dtype=dt)
    assert_rule(out, ro, no)
    # NumPy: the same encoding, bit for bit; without dropout, None as in flash-attn
    _, _, Sn = flash_attn_func(q.numpy(), k.numpy(), v.numpy(), dropout_p=p, causal=True, window_size=window,
                               return_attn_probs=True, dropout_seed=seed)
    assert np.array_equal(Sn[:, :, :Sq, :Sk].view(np.uint16 if dt == torch.float16 else np.uint32),
                          S.numpy().view(np.uint16 if dt == torch.float16 else np.uint32))
    assert flash_attn_func(q, k, v, return_attn_probs=True)[2] is None


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_varlen_attn_probs_encoding(dtype):
    # flash-attn's varlen S_dmask: (batch, nheads, max_seqlen_q, max_seqlen_k) rounded up to
    # 128, sequence b in [b, :, :len_q, :len_k]; the keep bits are the Philox rule with b the
    # sequence and i, j from its first row (docs/semantics.md, section 6)
    dt = getattr(torch, dtype)
    lq, lk = [5, 0, 130, 9], [7, 3, 140, 9]
    Hq, Hk, D, p, seed = 4, 2, 16, 0.3, 99
    cu_q = torch.tensor(np.cumsum([0] + lq), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + lk), dtype=torch.int32)
    q, k, v = randn(sum(lq), Hq, D, dtype=dt, seed=4), randn(sum(lk), Hk, D, dtype=dt, seed=5), randn(sum(lk), Hk, D, dtype=dt, seed=6)
    alibi = torch.rand(len(lq), Hq, generator=torch.Generator().manual_seed(7)) * 0.1  # a row per sequence
    out, lse, S = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), dropout_p=p, causal=True,
                                         alibi_slopes=alibi, return_attn_probs=True, dropout_seed=seed)
    assert S.shape == (len(lq), Hq, 256, 256) and S.dtype == dt
    for b in range(len(lq)):
        Sb = S[b, :, :lq[b], :lk[b]]
        pad = S[b].clone()
        pad[:, :lq[b], :lk[b]] = 0
        assert not pad.any(), f"sequence {b}: nonzero outside its lengths"
        if lq[b] == 0:
            continue
        keep = ~torch.signbit(Sb)
        assert np.array_equal(keep.numpy(), dropout_keep_rule(b + 1, Hq, lq[b], lk[b], p, seed, 0)[b]), b
        qb = q[cu_q[b]:cu_q[b + 1]][None]
        kb, vb = k[cu_k[b]:cu_k[b + 1]][None], v[cu_k[b]:cu_k[b + 1]][None]
        eye = torch.eye(lk[b], dtype=torch.float64)[None, :, None, :].expand(1, lk[b], Hk, lk[b])
        ref, _ = attn_ref(qb.double(), kb.double(), eye, causal="bottom-right", alibi=alibi[b:b + 1])
        err = (Sb.abs().double() - ref[0].transpose(0, 1)).abs().max().item()
        assert err <= (1e-6 if dt == torch.float32 else 2e-3), (b, err)
        # the call's output is the dropped probabilities times v under the same mask
        ro, _ = attn_ref(qb.double(), kb.double(), vb.double(), causal="bottom-right", alibi=alibi[b:b + 1],
                         keep=keep[None], dropout_p=p)
        no, _ = attn_ref(qb, kb, vb, causal="bottom-right", alibi=alibi[b:b + 1], keep=keep[None], dropout_p=p,
                         dtype=dt)
        assert_rule(out[cu_q[b]:cu_q[b + 1]][None], ro, no)
    # NumPy gives the same bits; a larger max_seqlen sizes S_dmask as flash-attn's does
    _, _, Sn = flash_attn_varlen_func(q.numpy(), k.numpy(), v.numpy(), cu_q.numpy(), cu_k.numpy(), 300, max(lk),
                                      dropout_p=p, causal=True, alibi_slopes=alibi.numpy(), return_attn_probs=True,
                                      dropout_seed=seed)
    assert Sn.shape == (len(lq), Hq, 384, 256)
    u = np.uint16 if dt == torch.float16 else np.uint32
    assert np.array_equal(Sn[:, :, :256].view(u), S.numpy().view(u)) and not Sn[:, :, 256:].any()
    assert flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), return_attn_probs=True)[2] is None
