"""test_tree_mask.py: flash_attn_with_kvcache(tree_mask=...), a speculative draft tree in one call.

Row i (draft token i) sees every key of its sequence before the draft tokens and the
draft tokens tree_mask[i] keeps. The reference is conftest's fp64 oracle on each
sequence's keys (the cache's, then the appended ones) with that dense mask; the
caches are contiguous and paged, with GQA, uneven lengths, left padding, no append
(the draft tokens already in the cache), bf16 and one tree per sequence.
"""

import pytest

from conftest import assert_rule, attn_ref, needs_torch, randn, torch

pytestmark = needs_torch

import flashattn  # noqa: E402


def _tree(n, seed):
    """A random draft tree of n tokens in topological order: parent[i] < i; row i keeps
    its ancestors and itself."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        keep[i, i] = True
        if i:
            p = int(torch.randint(0, i, (1,), generator=g))
            keep[i] |= keep[p]
    return keep


def _reference(q, caches, news, trees, dtype):
    """Per sequence: the oracle over keys (its cache, then its new rows) with the tree's mask."""
    outs, naives = [], []
    n = q.shape[1]
    for b, ((kc, vc), (kn, vn), tree) in enumerate(zip(caches, news, trees)):
        k = torch.cat([kc, kn]) if kn is not None else kc
        v = torch.cat([vc, vn]) if vn is not None else vc
        L = k.shape[0]
        mask = torch.ones(n, L, dtype=torch.bool)
        mask[:, L - n:] = tree
        args = (q[b:b + 1], k[None], v[None])
        outs.append(attn_ref(*args, mask=mask)[0])
        naives.append(attn_ref(*args, mask=mask, dtype=dtype)[0])
    return torch.cat(outs), torch.cat(naives)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("append", [True, False])
def test_tree_over_cache(paged, dtype, append):
    B, Hq, Hk, D, n, S_max = 3, 4, 2, 64, 9, 640
    lens = [300, 517 - (0 if append else n), 5]  # keys in the cache before the call
    if not append:
        lens = [x + n for x in lens]
    kc = randn(B, S_max, Hk, D, dtype=dtype, seed=1)
    vc = randn(B, S_max, Hk, D, dtype=dtype, seed=2)
    q = randn(B, n, Hq, D, dtype=dtype, seed=3)
    kn = randn(B, n, Hk, D, dtype=dtype, seed=4) if append else None
    vn = randn(B, n, Hk, D, dtype=dtype, seed=5) if append else None
    trees = torch.stack([_tree(n, s) for s in range(B)])
    caches = [(kc[b, :lens[b]].clone(), vc[b, :lens[b]].clone()) for b in range(B)]
    news = [(kn[b], vn[b]) if append else (None, None) for b in range(B)]
    seqlens = torch.tensor(lens, dtype=torch.int32)
    kw = {}
    k_cache, v_cache = kc, vc
    if paged:
        page = 64
        pages = S_max // page
        perm = torch.randperm(B * pages, generator=torch.Generator().manual_seed(7))
        k_cache = torch.empty(B * pages, page, Hk, D, dtype=dtype)
        v_cache = torch.empty_like(k_cache)
        k_cache[perm] = kc.reshape(B * pages, page, Hk, D)
        v_cache[perm] = vc.reshape(B * pages, page, Hk, D)
        kw["block_table"] = perm.reshape(B, pages).to(torch.int32)
    out = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, kn, vn, cache_seqlens=seqlens, tree_mask=trees, **kw)
    ref, naive = _reference(q, caches, news, trees, dtype)
    assert_rule(out, ref, naive)


def test_one_tree_shared_and_left_padding():
    B, H, D, n, S_max = 2, 2, 32, 6, 200
    tree = _tree(n, 11)
    kc = randn(B, S_max, H, D, seed=1)
    vc = randn(B, S_max, H, D, seed=2)
    q = randn(B, n, H, D, seed=3)
    kn = randn(B, n, H, D, seed=4)
    vn = randn(B, n, H, D, seed=5)
    lens, pads = [150, 150], [0, 37]
    out = flashattn.flash_attn_with_kvcache(q, kc.clone(), vc.clone(), kn, vn,
                                            cache_seqlens=torch.tensor(lens, dtype=torch.int32),
                                            cache_leftpad=torch.tensor(pads, dtype=torch.int32), tree_mask=tree)
    caches = [(kc[b, pads[b]:lens[b]], vc[b, pads[b]:lens[b]]) for b in range(B)]
    ref, naive = _reference(q, caches, [(kn[b], vn[b]) for b in range(B)], [tree] * B, torch.float32)
    assert_rule(out, ref, naive)


def test_tree_mask_numpy_and_errors():
    import numpy as np

    B, H, D, n = 1, 2, 16, 4
    kc = np.random.default_rng(0).standard_normal((B, 64, H, D)).astype(np.float32)
    vc = np.random.default_rng(1).standard_normal((B, 64, H, D)).astype(np.float32)
    q = np.random.default_rng(2).standard_normal((B, n, H, D)).astype(np.float32)
    tree = np.eye(n, dtype=bool)
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20, tree_mask=tree)
    t = torch.from_numpy
    ref, naive = _reference(t(q), [(t(kc[0, :20]), t(vc[0, :20]))], [(None, None)], [t(tree)], torch.float32)
    assert_rule(t(out), ref, naive)
    with pytest.raises(ValueError, match="tree_mask must be bool"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20, tree_mask=np.eye(n + 1, dtype=bool))
    with pytest.raises(ValueError, match="tree_mask must be bool"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20, tree_mask=np.eye(n, dtype=np.float32))
    with pytest.raises(ValueError, match="at least seqlen_q"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=2, tree_mask=tree)
