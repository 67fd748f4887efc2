"""conftest.py: the oracle and the accuracy rule every Python test judges by.

attn_ref() is an explicit formula of docs/semantics.md, section 3 (scale,
softcap, bias, ALiBi, masks with both causal alignments, windows, dropout by a
given keep-mask), written with plain torch ops; run in float64 it is the oracle,
run in the input dtype it is the "naive same-precision implementation" of the
accuracy rule (section 5): max|x - ref| <= 2 * max|naive - ref| + ulps * eps * max(1, max|ref|).
Gradients are that formula's autograd gradients, in the same two precisions.
Tests that need torch skip visibly when it is absent.
"""

import math

import numpy as np
import pytest

try:
    import torch
except ImportError:  # pragma: no cover - the test venv has torch
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def attn_ref(q, k, v, *, scale=None, causal=None, window=(-1, -1), softcap=0.0, alibi=None, bias=None, mask=None,
             keep=None, dropout_p=0.0, dtype=None, sinks=None):
    """o (B, Sq, Hq, Dv) and lse (B, Hq, Sq) of BSND q, k, v in `dtype` (default float64).

    causal: None, "bottom-right" or "top-left". bias/mask broadcast to (B, Hq, Sq, Sk);
    keep (B, Hq, Sq, Sk) bool is a dropout keep-mask. sinks (Hq,): gpt-oss's rule as
    gpt-oss writes it, the masked scores get one more column holding the head's sink
    logit, the softmax runs over all of them, and the sink's column is dropped before
    P @ V; the lse is the same row's, sink included."""
    dtype = dtype or torch.float64
    B, Sq, Hq, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    g = Hq // Hk
    qh = q.to(dtype).transpose(1, 2)
    kh = k.to(dtype).transpose(1, 2).repeat_interleave(g, dim=1)
    vh = v.to(dtype).transpose(1, 2).repeat_interleave(g, dim=1)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = (qh @ kh.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.to(dtype)
    i = torch.arange(Sq)[:, None]
    j = torch.arange(Sk)[None, :]
    d = i + Sk - Sq
    if alibi is not None:
        a = alibi.to(dtype)
        a = a[None, :, None, None] if a.dim() == 1 else a[:, :, None, None]
        s = s - a * (d - j).abs().to(dtype)
    kept = torch.ones(B, Hq, Sq, Sk, dtype=torch.bool)
    if mask is not None:
        kept = kept & mask
    if causal == "bottom-right":
        kept = kept & (j <= d)
    elif causal == "top-left":
        kept = kept & (j <= i)
    if window[0] >= 0:
        kept = kept & (j >= d - window[0])
    if window[1] >= 0:
        kept = kept & (j <= d + window[1])
    s = s.masked_fill(~kept, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.to(dtype).reshape(1, Hq, 1, 1).expand(B, Hq, Sq, 1)], dim=-1)
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    p = e / torch.where(l > 0, l, torch.ones_like(l))
    lse = (torch.log(l.double()) + m.double()).squeeze(-1)
    if sinks is not None:
        p = p[..., :-1]  # the sink has no value
    if keep is not None:
        p = p * keep.to(dtype) / (1.0 - dropout_p)
    o = (p @ vh).transpose(1, 2)
    return o, lse


def rule_tol(ref, naive, dtype, ulps):
    eps = torch.finfo(dtype).eps
    nerr = (naive.double() - ref).abs().max().item() if ref.numel() else 0.0
    top = ref.abs().max().item() if ref.numel() else 0.0
    return 2.0 * nerr + ulps * eps * max(1.0, top)


def assert_rule(got, ref, naive, ulps=4, what="out"):
    """The accuracy rule of docs/semantics.md, section 5; the message has the numbers."""
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    if not ref.numel():
        return
    err = (got.double() - ref).abs().max().item()
    tol = rule_tol(ref, naive, got.dtype if got.dtype != torch.float64 else torch.float32, ulps)
    assert err <= tol, f"{what}: max error {err:.3g} > tolerance {tol:.3g} (dtype {got.dtype})"


def randn(*shape, dtype=None, seed=None, scale=1.0):
    gen = torch.Generator().manual_seed(seed if seed is not None else hash(shape) % 2**31)
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype or torch.float32)


# ---------------------------------------------------------------- Philox (SEMANTICS.md)
M32 = 0xFFFFFFFF


def philox4x32_10(c, key):
    """Philox4x32-10 on one counter (c0, c1, c2, c3) and key (k0, k1): four uint32 words.
    Written from SEMANTICS.md's definition alone, independently of the C code."""
    c0, c1, c2, c3 = (int(x) & M32 for x in c)
    k0, k1 = int(key[0]) & M32, int(key[1]) & M32
    for r in range(10):
        if r:
            k0 = (k0 + 0x9E3779B9) & M32
            k1 = (k1 + 0xBB67AE85) & M32
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        hi0, lo0 = p0 >> 32, p0 & M32
        hi1, lo1 = p1 >> 32, p1 & M32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def philox_np(c0, c1, c2, c3, k0, k1):
    """The same generator vectorised over uint64 arrays holding 32-bit words."""
    c0, c1, c2, c3 = (np.asarray(x, dtype=np.uint64) & np.uint64(M32) for x in (c0, c1, c2, c3))
    k0, k1 = np.uint64(k0 & M32), np.uint64(k1 & M32)
    m = np.uint64(M32)
    for r in range(10):
        if r:
            k0 = (k0 + np.uint64(0x9E3779B9)) & m
            k1 = (k1 + np.uint64(0xBB67AE85)) & m
        p0 = np.uint64(0xD2511F53) * c0  # < 2^64: no wrap
        p1 = np.uint64(0xCD9E8D57) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & m
        hi1, lo1 = p1 >> np.uint64(32), p1 & m
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def sink_ref(q, k, v, sinks, *, causal=False, window=(-1, -1), scale=None, dtype=None):
    """attn_ref with sinks, causal a bool (flash-attn's bottom-right alignment)."""
    return attn_ref(q, k, v, sinks=sinks, causal="bottom-right" if causal else None, window=window, scale=scale,
                    dtype=dtype)


def dropout_keep_rule(B, Hq, Sq, Sk, dropout_p, seed, offset, q_start=0, k_start=0):
    """keep[b, h, i, j] by SEMANTICS.md's rule: counter (j // 4, i, b*Hq + h, offset),
    key (seed mod 2^32, seed >> 32), word j % 4, kept iff u < floor((1 - p) * 2^32)."""
    b, h, i, j = np.meshgrid(np.arange(B), np.arange(Hq), np.arange(Sq) + q_start, np.arange(Sk) + k_start,
                             indexing="ij")
    words = philox_np(j // 4, i, b * Hq + h, np.full(j.shape, offset), seed & M32, seed >> 32)
    jm = (j % 4)
    u = np.choose(jm, words)
    t = math.floor((1.0 - dropout_p) * 2.0**32)
    return u < t
