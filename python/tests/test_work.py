"""test_work.py: flashattn.forward_work, the library's count of a call's kept pairs and FLOPs.

The oracle counts the band of docs/semantics.md, section 3, pair by pair: no closed
form, so it does not share a mistake with the library's (src/algos/scores.c).
"""

import numpy as np
import pytest

import flashattn

from conftest import needs_torch, torch


def brute_pairs(Sq, Sk, causal=False, window=(-1, -1)):
    """Kept (i, j) pairs of one (sequence, head), by walking every pair."""
    left, right = window
    n = 0
    for i in range(Sq):
        d = i + Sk - Sq  # the bottom-right diagonal
        for j in range(Sk):
            if causal in (True, "bottom-right") and j > d:
                continue
            if causal == "top-left" and j > i:
                continue
            if left >= 0 and j < d - left:
                continue
            if right >= 0 and j > d + right:
                continue
            n += 1
    return n


def zeros(*shape, dtype=np.float32):
    return np.zeros(shape, dtype=dtype)


def check(work, pairs, D, Dv):
    assert work["pairs"] == pairs
    assert work["flops"] == 2.0 * (D + Dv) * pairs
    assert work["backward_flops"] == 2.5 * work["flops"]


CASES = [  # (Sq, Sk, causal, window)
    (7, 7, False, (-1, -1)), (7, 7, True, (-1, -1)), (7, 7, "top-left", (-1, -1)),
    (5, 11, True, (-1, -1)), (5, 11, "top-left", (-1, -1)), (11, 5, True, (-1, -1)), (11, 5, "top-left", (-1, -1)),
    (9, 9, False, (2, 1)), (6, 13, False, (3, 0)), (13, 6, False, (0, 4)), (9, 9, True, (3, -1)),
    (6, 13, "top-left", (2, 5)), (13, 6, "top-left", (-1, 2)), (8, 8, False, (0, 0)), (4, 30, False, (100, 100)),
]


@pytest.mark.parametrize("Sq,Sk,causal,window", CASES)
def test_forward_work_dense_counts_the_band(Sq, Sk, causal, window):
    B, Hq, Hk, D, Dv = 2, 6, 2, 16, 8
    w = flashattn.forward_work(zeros(B, Sq, Hq, D), zeros(B, Sk, Hk, D), zeros(B, Sk, Hk, Dv), causal=causal,
                               window_size=window)
    check(w, B * Hq * brute_pairs(Sq, Sk, causal, window), D, Dv)


def test_forward_work_unmasked_is_the_documented_formula():
    B, Hq, Sq, Sk, D, Dv = 3, 4, 17, 29, 64, 32
    w = flashattn.forward_work(zeros(B, Sq, Hq, D), zeros(B, Sk, 2, D), zeros(B, Sk, 2, Dv))
    assert w["flops"] == 2.0 * B * Hq * Sq * Sk * (D + Dv)


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), ("top-left", (-1, -1)),
                                           (False, (3, 2)), (True, (4, -1))])
def test_forward_work_varlen_counts_each_sequence(causal, window):
    lq, lk = [3, 0, 9, 5], [7, 4, 9, 2]  # each sequence at its own lengths
    cu_q, cu_k = np.cumsum([0] + lq).astype(np.int32), np.cumsum([0] + lk).astype(np.int32)
    Hq, Hk, D = 4, 2, 8
    w = flashattn.forward_work(zeros(sum(lq), Hq, D), zeros(sum(lk), Hk, D), zeros(sum(lk), Hk, D), causal=causal,
                               window_size=window, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    check(w, Hq * sum(brute_pairs(a, b, causal, window) for a, b in zip(lq, lk)), D, D)


@pytest.mark.parametrize("causal", [False, True])
def test_forward_work_cache_counts_keys_after_the_append(causal):
    B, Sq, Hq, Hk, D, Smax = 3, 2, 4, 2, 8, 20
    kc, vc = zeros(B, Smax, Hk, D), zeros(B, Smax, Hk, D)
    seqlens = np.array([5, 0, 11], dtype=np.int32)
    kn, vn = zeros(B, Sq, Hk, D), zeros(B, Sq, Hk, D)
    before = kc.copy()
    w = flashattn.forward_work(zeros(B, Sq, Hq, D), kn + 1, vn, causal=causal, k_cache=kc, v_cache=vc,
                               cache_seqlens=seqlens)
    check(w, Hq * sum(brute_pairs(Sq, n + Sq, causal) for n in seqlens), D, D)
    assert np.array_equal(kc, before)  # counted, not appended
    w = flashattn.forward_work(zeros(B, 1, Hq, D), None, None, causal=causal, k_cache=kc, v_cache=vc,
                               cache_seqlens=7)
    check(w, B * Hq * brute_pairs(1, 7, causal), D, D)


def test_forward_work_refuses_what_the_call_would():
    q = zeros(1, 8, 3, 16)
    with pytest.raises(ValueError, match="fa_forward_work"):
        flashattn.forward_work(q, zeros(1, 8, 2, 16), zeros(1, 8, 2, 16))  # 3 query heads over 2 kv heads
    with pytest.raises(ValueError, match="window_size"):
        flashattn.forward_work(q, q, q, window_size=(-2, 0))


@needs_torch
def test_forward_work_torch_tensors():
    q = torch.zeros(2, 9, 4, 16, dtype=torch.bfloat16, requires_grad=True)
    k = torch.zeros(2, 12, 4, 16, dtype=torch.bfloat16)
    w = flashattn.forward_work(q, k, k, causal="top-left", window_size=(5, -1))
    check(w, 2 * 4 * brute_pairs(9, 12, "top-left", (5, -1)), 16, 16)
