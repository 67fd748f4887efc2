"""flashattn.interface: the flash-attn 2.x functions, for NumPy arrays and torch tensors.

Owns the public call signatures (names, argument names, defaults and BSND layouts
of Dao-AILab's flash-attn 2.x) and the extensions beyond them: a bool or float
`attn_mask`, `causal="top-left"`, explicit dropout seeds, int8 KV caches and
merge_states. torch tensors go to flashattn.torch._ops (differentiable custom
ops); anything else is read as a NumPy array and gives NumPy results (forward only).
"""

import sys

import numpy as np

from . import _C, _core
from ._core import is_torch


_ops_module = None


def _ops():
    global _ops_module
    if _ops_module is None:
        from .torch import _ops  # imports torch: only reached with torch tensors in hand

        _ops_module = _ops
    return _ops_module


def _np(x, name):
    if x is None:
        return None
    a = np.asarray(x)
    return a


def _need_ndim(x, n, name, shape):
    if x.ndim != n:
        raise ValueError(f"{name} must be {n}-d {shape}, got shape {tuple(x.shape)}")


def _pad4(m):
    """A mask or bias broadcastable to (batch, nheads, seqlen_q, seqlen_k), as a 4-d view."""
    if m.ndim > 4:
        raise ValueError(f"attn_mask must have at most 4 dims (batch, nheads, seqlen_q, seqlen_k), got {m.ndim}")
    return m.reshape((1,) * (4 - m.ndim) + tuple(m.shape))


def _mask_split(attn_mask, torch_side):
    """attn_mask -> (bias, mask): bool means attend-where-true, float is added to the scores."""
    if attn_mask is None:
        return None, None
    if torch_side:
        import torch

        m = _pad4(attn_mask)
        return (None, m) if m.dtype == torch.bool else (m, None)
    m = _pad4(np.asarray(attn_mask))
    return (None, m) if m.dtype == np.bool_ else (m, None)


def _seed(dropout_p, dropout_seed, torch_side):
    if dropout_p == 0.0:
        return 0
    if dropout_seed is not None:
        s = int(dropout_seed)
        if not 0 <= s < 2**63:
            raise ValueError("dropout_seed must lie in [0, 2^63)")
        return s
    if torch_side:
        import torch

        return int(torch.randint(0, 2**62, (1,)).item())  # follows torch.manual_seed
    return int(np.random.randint(0, 2**62, dtype=np.int64))  # follows np.random.seed


def _offset(dropout_offset):
    o = int(dropout_offset)
    if not 0 <= o < 2**32:
        raise ValueError("dropout_offset must lie in [0, 2^32)")
    return o


def _alibi(alibi_slopes, torch_side):
    if alibi_slopes is None:
        return None
    if torch_side:
        import torch

        return alibi_slopes.detach().to(torch.float32).contiguous()
    return np.ascontiguousarray(alibi_slopes, dtype=np.float32)


def _sinks(sinks, torch_side):
    """Sink logits (nheads,) as contiguous float32; the torch conversion keeps the
    autograd graph, so the gradient reaches the caller's tensor in its dtype."""
    if sinks is None:
        return None
    if torch_side:
        import torch

        if not is_torch(sinks):
            sinks = torch.as_tensor(np.asarray(sinks))
        if sinks.device.type != "cpu":
            raise ValueError(f"sinks is on {sinks.device}; flashattn runs on CPU tensors only")
        return sinks.to(torch.float32).contiguous()
    return np.ascontiguousarray(sinks, dtype=np.float32)


def _np_forward(q, k, v, *, bias=None, mask=None, alibi=None, cu_q=None, cu_k=None, opts, want_mask=False,
                need_lse=True, sinks=None):
    """The NumPy forward: allocates o, lse (when needed; the library then skips it)
    and the dropout mask, and calls the library."""
    B, Sq, Hq, _ = q.shape
    out = np.empty((B, Sq, Hq, v.shape[3]), dtype=q.dtype)
    lse = np.empty((B, Hq, Sq), dtype=np.float32) if need_lse else None
    dm = np.empty((B, Hq, Sq, k.shape[1]), dtype=np.bool_) if want_mask else None
    _C.forward(_core.current_context(), q, k, v, out, lse, opts, alibi_slopes=alibi, bias=bias, mask=mask,
               cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, dropout_mask=dm, sinks=sinks)
    return out, lse, dm


_kvcache_torch = _C.kvcache_torch
_current_context = _core.current_context

_Options = _core.Options
_PLAIN = _core.DEFAULT_OPTIONS
_PLAIN_CAUSAL = _Options(causal=_core.CAUSAL_BOTTOM_RIGHT)
_NO_WINDOW = (-1, -1)
_NUMBERS = (float, int)


def _options(dropout_p, softmax_scale, causal, window_size, softcap, dropout_seed, dropout_offset, torch_side):
    # The defaults (and causal=True) in a few comparisons: the checks below cost
    # ~0.5 us, a tenth of a small call. `is` on the bools: causal=1 must still reach causal_of.
    # The types first, so that no tensor or array argument is ever compared here.
    if (softmax_scale is None and type(dropout_p) in _NUMBERS and type(softcap) in _NUMBERS and
            type(window_size) is tuple and type(dropout_offset) is int and dropout_p == 0.0 and softcap == 0.0 and
            dropout_offset == 0 and window_size == _NO_WINDOW):
        if causal is False:
            return _PLAIN
        if causal is True:
            return _PLAIN_CAUSAL
    # dropout_p in [0, 1) and softcap >= 0 are the library's rules: its status
    # (ValueError, in its words) answers an out-of-range value
    p = float(dropout_p)
    wl, wr = _core.window_of(window_size)
    return _Options(scale=_core.scale_of(softmax_scale), softcap=float(softcap), causal=_core.causal_of(causal),
                    window_left=wl, window_right=wr, dropout_p=p, dropout_seed=_seed(p, dropout_seed, torch_side),
                    dropout_offset=_offset(dropout_offset))


_QUANT = _core.Context._QUANT_MATMUL


def _quant(opts, quant_matmul):
    """opts with this call's int8 products (fa_forward_args.quant_matmul, docs/semantics.md,
    section 11): None keeps the context's (Context.quant_matmul); "exact", "i8", "i8x2"
    or 0, 1, 2 set them for the call (the library refuses other numbers)."""
    if quant_matmul is None:
        return opts
    if isinstance(quant_matmul, str):
        if quant_matmul not in _QUANT:
            raise ValueError(f"quant_matmul must be one of {sorted(_QUANT)} (or 0, 1, 2), got {quant_matmul!r}")
        return opts._replace(quant_matmul=_QUANT[quant_matmul])
    return opts._replace(quant_matmul=int(quant_matmul))


_F32 = {"ieee": 0, "bf16x3": 1, "bf16": 2}
# torch.get_float32_matmul_precision() as f32_matmul: "highest" (torch's default) leaves
# the context's setting (ieee unless FLASHATTN_F32_MATMUL or the context says otherwise)
_TORCH_F32 = {"high": 1, "medium": 2}
_torch_precision = None  # torch.get_float32_matmul_precision as torch.compile may call it


def _torch_f32_mode(torch):
    """The f32_matmul that torch's precision asks for, or None. The reading is marked a
    constant for torch.compile (a str-returning torch.* call breaks its graph): a compiled
    graph keeps the precision it was traced with. Set up eagerly (flashattn.torch's import
    calls this), never inside a trace."""
    global _torch_precision
    if _torch_precision is None:
        def read():
            return torch.get_float32_matmul_precision()
        _torch_precision = torch.compiler.assume_constant_result(read)
    return _TORCH_F32.get(_torch_precision())


def _f32mm(opts, f32_matmul, q, torch_side):
    """opts with this call's f32 products (fa_forward_args.f32_matmul, docs/semantics.md,
    section 5): "ieee", "bf16x3", "bf16" or 0, 1, 2 set them for the call (the library
    refuses other numbers); None follows torch.get_float32_matmul_precision() for f32
    torch tensors ("high" bf16x3, "medium" bf16, "highest" the context's setting) and
    keeps the context's for anything else."""
    if f32_matmul is None:
        if not torch_side:
            return opts
        torch = sys.modules["torch"]
        if q.dtype is not torch.float32:
            return opts
        m = _torch_f32_mode(torch)
        return opts if m is None else opts._replace(f32_matmul=m)
    if isinstance(f32_matmul, str):
        if f32_matmul not in _F32:
            raise ValueError(f"f32_matmul must be one of {sorted(_F32)} (or 0, 1, 2), got {f32_matmul!r}")
        return opts._replace(f32_matmul=_F32[f32_matmul])
    return opts._replace(f32_matmul=int(f32_matmul))


def _round128(n):
    return (n + 127) // 128 * 128


def _probs(q, k, bias, mask, alibi, opts, t, sinks=None):
    """The softmax probabilities p_ij (undropped) of a dense call, (batch, nheads, seqlen_q,
    seqlen_k) f32, from the library itself (every mask, softcap, ALiBi and sink rule as
    the call applies it): the same call without dropout on v = the identity, so that
    o_i = sum_j p_ij e_j = p_i."""
    B, Sq, Hq, _ = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    opts = opts._replace(dropout_p=0.0, dropout_seed=0, dropout_offset=0)
    if t:
        import torch
        from torch.utils.dlpack import to_dlpack

        eye = torch.eye(Sk, dtype=q.dtype)[None, :, None, :].expand(B, Sk, Hk, Sk)
        p = torch.empty((B, Sq, Hq, Sk), dtype=torch.float32)
        sinks = _sinks(sinks, t)
        call = [None if x is None else to_dlpack(x.detach()) for x in (q, k, eye, p, bias, mask, alibi, sinks)]
    else:
        eye = np.broadcast_to(np.eye(Sk, dtype=q.dtype)[None, :, None, :], (B, Sk, Hk, Sk))
        p = np.empty((B, Sq, Hq, Sk), dtype=np.float32)
        call = [q, k, eye, p, bias, mask, alibi, _sinks(sinks, t)]
    qa, ka, ea, pa, ba, ma, aa, sa = call
    _C.forward(_core.current_context(), qa, ka, ea, pa, opts=opts, alibi_slopes=aa, bias=ba, mask=ma, sinks=sa)
    return p.permute(0, 2, 1, 3) if t else p.transpose(0, 2, 1, 3)


def _signed(p, keep, dtype, t):
    """flash-attn's encoding of probabilities p under the keep-mask: p where kept, -p
    (the sign bit set, -0.0 for p = 0) where dropped, in dtype."""
    if t:
        import torch

        return torch.where(keep, p, -p).to(dtype)
    return np.where(keep, p, -p).astype(dtype)


def _zeros(shape, dtype, t):
    if t:
        import torch

        return torch.zeros(shape, dtype=dtype)
    return np.zeros(shape, dtype=dtype)


def _attn_probs(q, k, bias, mask, alibi, opts, keep, t, sinks=None):
    """flash-attn's S_dmask for a dense call with dropout: (batch, nheads, seqlen_q rounded
    up to 128, seqlen_k likewise) in q's dtype, the probabilities (_probs) encoded by the
    call's keep-mask (_signed), zero in the padding."""
    B, Sq, Hq, _ = q.shape
    Sk = k.shape[1]
    out = _zeros((B, Hq, _round128(Sq), _round128(Sk)), q.dtype, t)
    out[:, :, :Sq, :Sk] = _signed(_probs(q, k, bias, mask, alibi, opts, t, sinks), keep, q.dtype, t)
    return out


def _varlen_attn_probs(q, k, cu_q, cu_k, max_seqlen_q, max_seqlen_k, alibi, opts, t, sinks):
    """flash-attn's S_dmask for a varlen call with dropout: (batch, nheads, max_seqlen_q
    rounded up to 128, max_seqlen_k likewise), sequence b's probabilities encoded in
    [b, :, :len_q(b), :len_k(b)], zero elsewhere. The keep bits are the library's: the
    mask of a dense call on zero rows of width 1 padded to (batch, max_seqlen), whose
    (b, h, i, j) draw exactly the varlen call's (docs/semantics.md, section 6: b the
    sequence, i and j counted from its first row). The probabilities are each
    sequence's own dense call (_probs), with its row of a (batch, nheads) ALiBi."""
    cq, ck = [int(x) for x in cu_q], [int(x) for x in cu_k]
    lq = [b - a for a, b in zip(cq, cq[1:])]
    lk = [b - a for a, b in zip(ck, ck[1:])]
    B, Hq = len(lq), q.shape[1]
    mq = max(lq, default=0) if not isinstance(max_seqlen_q, int) else max_seqlen_q
    mk = max(lk, default=0) if not isinstance(max_seqlen_k, int) else max_seqlen_k
    out = _zeros((B, Hq, _round128(mq), _round128(mk)), q.dtype, t)
    if B == 0 or mq == 0 or mk == 0:
        return out
    # the keep bits alone: no scale, mask or window, the call's dropout
    mask_opts = _Options(scale=1.0, dropout_p=opts.dropout_p, dropout_seed=opts.dropout_seed,
                         dropout_offset=opts.dropout_offset)
    if t:
        import torch

        z = torch.zeros((B, mq, Hq, 1), dtype=torch.float32), torch.zeros((B, mk, 1, 1), dtype=torch.float32)
        keep = _ops().attention(z[0], z[1], z[1], None, None, None, None, None, mask_opts, True, need_lse=False)[2]
    else:
        z = np.zeros((B, mq, Hq, 1), dtype=np.float32), np.zeros((B, mk, 1, 1), dtype=np.float32)
        keep = _np_forward(z[0], z[1], z[1], opts=mask_opts, want_mask=True, need_lse=False)[2]
    for b in range(B):
        if lq[b] == 0 or lk[b] == 0:
            continue
        ab = alibi if alibi is None or alibi.ndim == 1 else alibi[b:b + 1]
        p = _probs(q[cq[b]:cq[b + 1]][None], k[ck[b]:ck[b + 1]][None], None, None, ab, opts, t, sinks)
        out[b, :, :lq[b], :lk[b]] = _signed(p[0], keep[b, :, :lq[b], :lk[b]], q.dtype, t)
    return out


def _result(out, lse, dm, return_attn_probs):
    return (out, lse, dm) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, attn_mask=None,
                    dropout_seed=None, dropout_offset=0, sinks=None, quant_matmul=None, f32_matmul=None):
    """Attention over q (batch, seqlen_q, nheads, headdim), k, v (batch, seqlen_k, nheads_k, headdim[_v]).

    As flash-attn 2.x: causal is aligned bottom-right, window_size (left, right)
    likewise, nheads % nheads_k == 0 is GQA/MQA, alibi_slopes (nheads,) or
    (batch, nheads) fp32. Returns out (batch, seqlen_q, nheads, headdim_v); with
    return_attn_probs also softmax_lse (batch, nheads, seqlen_q) fp32 and S_dmask (below).
    deterministic is accepted and has nothing to do: the backward is always
    deterministic.

    Beyond flash-attn (keyword-only): attn_mask, bool (True = attend) or float (added
    to the scores), broadcastable to (batch, nheads, seqlen_q, seqlen_k);
    causal="top-left" (PyTorch's alignment); dropout_seed / dropout_offset fix the
    Philox stream (default: a seed drawn from torch's or NumPy's global generator);
    sinks (nheads,), gpt-oss's attention sinks: one logit per head added to each
    row's softmax normaliser, with no value (docs/semantics.md, step 6); with torch
    a gradient flows to them.
    quant_matmul: this call's int8 products ("exact", "i8", "i8x2"; docs/semantics.md,
    section 11); None (default) takes the context's (Context.quant_matmul). Inference
    only: a backward through a call whose mode is not "exact" is refused.
    f32_matmul: this call's f32 products ("ieee", "bf16x3", "bf16"; docs/semantics.md,
    section 5); None (default) follows torch.get_float32_matmul_precision() for f32
    torch tensors ("high" bf16x3, "medium" bf16, "highest" the context's setting, ieee
    unless FLASHATTN_F32_MATMUL says otherwise) and takes the context's otherwise. The
    backward is ieee whatever the mode.

    With return_attn_probs and dropout, the third result is flash-attn's S_dmask:
    (batch, nheads, seqlen_q, seqlen_k), each rounded up to a multiple of 128, in q's
    dtype, holding the softmax probabilities with the sign bit set on the elements
    dropout dropped (so np.signbit / torch.signbit gives the dropped ones exactly);
    None without dropout, as in flash-attn.
    """
    t = is_torch(q)
    opts = _f32mm(_options(dropout_p, softmax_scale, causal, window_size, softcap, dropout_seed, dropout_offset, t),
                  f32_matmul, q, t)
    if quant_matmul is not None:
        opts = _quant(opts, quant_matmul)
    sinks = _sinks(sinks, t)
    if t and attn_mask is None and alibi_slopes is None and not return_attn_probs and sinks is None:
        out = _ops().forward_lean(q, k, v, opts)  # None: autograd, compile or profiler
        if out is not None:
            return out
    want = bool(return_attn_probs) and opts.dropout_p > 0
    if t:
        bias, mask = _mask_split(attn_mask, True)
        alibi = _alibi(alibi_slopes, True)
        out, lse, dm = _ops().attention(q, k, v, bias, mask, alibi, None, None, opts, want,
                                        need_lse=bool(return_attn_probs), sinks=sinks)
        return _result(out, lse, _attn_probs(q, k, bias, mask, alibi, opts, dm, True, sinks) if want else None,
                       return_attn_probs)
    asarray = np.asarray
    q, k, v = asarray(q), asarray(k), asarray(v)
    if not q.ndim == k.ndim == v.ndim == 4:
        for name, x in (("q", q), ("k", k), ("v", v)):
            _need_ndim(x, 4, name, "(batch, seqlen, nheads, headdim)")
    if attn_mask is None and alibi_slopes is None and not return_attn_probs and sinks is None:
        # the plain call in one binding call: out alone (the library skips the lse)
        B, Sq, Hq, _ = q.shape
        out = np.empty((B, Sq, Hq, v.shape[3]), dtype=q.dtype)
        _C.forward(_core.current_context(), q, k, v, out, None, opts)
        return out
    bias, mask = _mask_split(attn_mask, False)
    alibi = _alibi(alibi_slopes, False)
    out, lse, dm = _np_forward(q, k, v, bias=bias, mask=mask, alibi=alibi, opts=opts, want_mask=want,
                               need_lse=bool(return_attn_probs), sinks=sinks)
    return _result(out, lse, _attn_probs(q, k, bias, mask, alibi, opts, dm, False, sinks) if want else None,
                   return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, **kw):
    """qkv (batch, seqlen, 3, nheads, headdim): the three are strided views, no copy."""
    if qkv.ndim != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv must be (batch, seqlen, 3, nheads, headdim), got shape {tuple(qkv.shape)}")
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size,
                           softcap, alibi_slopes, deterministic, return_attn_probs, **kw)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, **kw):
    """kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    if kv.ndim != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv must be (batch, seqlen_k, 2, nheads_k, headdim), got shape {tuple(kv.shape)}")
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, **kw)


def _int32(x, torch_side, name):
    """An index array as contiguous int32; any integer dtype is converted, others refused."""
    if x is None:
        return None
    if is_torch(x):
        import torch

        if x.dtype is torch.int32 and x.device.type == "cpu" and x.is_contiguous():
            return x  # as it is (an index array takes no gradient): the per-call path of decoding
        if x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device}; flashattn runs on CPU tensors only")
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer array (int32), got {x.dtype}")
        return x.detach().to(torch.int32).contiguous()
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} must be an integer array (int32), got {a.dtype}")
    a = np.ascontiguousarray(a, dtype=np.int32)
    if torch_side:
        import torch

        return torch.from_numpy(a)
    return a


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *, seqused_k=None,
                           dropout_seed=None, dropout_offset=0, sinks=None, quant_matmul=None, f32_matmul=None):
    """Packed sequences: q (total_q, nheads, headdim), k, v (total_k, nheads_k, headdim[_v]),
    cu_seqlens_* int32 (batch + 1,) prefix sums. Returns out (total_q, nheads, headdim_v);
    with return_attn_probs also softmax_lse (nheads, total_q) and, with dropout,
    flash-attn's S_dmask: (batch, nheads, max_seqlen_q, max_seqlen_k), each rounded up to
    a multiple of 128, sequence b's probabilities in [b, :, :len_q(b), :len_k(b)] with
    the sign bit set where dropout dropped them, zero elsewhere (None without dropout,
    as in flash-attn). max_seqlen_* are checked against cu_seqlens when given as ints,
    and then size S_dmask, as flash-attn's do.

    Paged keys (flash-attn's block_table): k, v are page pools (num_pages, page_size,
    nheads_k, headdim[_v]) of any page size, block_table (batch, max_pages) int32 page
    ids, and sequence b's keys are its first cu_seqlens_k[b+1] - cu_seqlens_k[b] rows
    (or seqused_k[b], keyword-only, as flash-attn 3 and vLLM name it), key j in row
    j % page_size of page block_table[b, j // page_size]. causal and windows align
    bottom-right over those keys, so a prefill chunk whose keys end with its own rows
    attends causally. This is the library's paged KV cache read without an append
    (flash_attn_with_kvcache appends); it is forward-only, without dropout.
    sinks (nheads,), quant_matmul and f32_matmul as in flash_attn_func.
    """
    t = is_torch(q)
    opts = _quant(_options(dropout_p, softmax_scale, causal, window_size, softcap, dropout_seed, dropout_offset, t),
                  quant_matmul)
    opts = _f32mm(opts, f32_matmul, q, t)
    if block_table is not None:
        return _varlen_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_k, block_table, t, opts,
                             alibi_slopes, return_attn_probs, sinks)
    if seqused_k is not None:
        raise ValueError("flash_attn_varlen_func: seqused_k goes with block_table (paged keys)")
    sinks = _sinks(sinks, t)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _need_ndim(x, 3, name, "(total, nheads, headdim)")
    cu_q, cu_k = _int32(cu_seqlens_q, t, "cu_seqlens_q"), _int32(cu_seqlens_k, t, "cu_seqlens_k")
    _check_max_seqlen("max_seqlen_q", cu_q, max_seqlen_q, t)
    _check_max_seqlen("max_seqlen_k", cu_k, max_seqlen_k, t)
    alibi = _alibi(alibi_slopes, t)
    if t:
        out, lse, _ = _ops().attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), None, None, alibi, cu_q, cu_k,
                                       opts, False, sinks=sinks)
        out, lse = out[0], lse[0]
    else:
        q, k, v = _np(q, "q"), _np(k, "k"), _np(v, "v")
        out, lse, _ = _np_forward(q[None], k[None], v[None], alibi=alibi, cu_q=cu_q, cu_k=cu_k, opts=opts, sinks=sinks)
        out, lse = out[0], lse[0]
    if not return_attn_probs:
        return out
    dm = (_varlen_attn_probs(q, k, cu_q, cu_k, max_seqlen_q, max_seqlen_k, alibi, opts, t, sinks)
          if opts.dropout_p > 0 else None)
    return out, lse, dm


def _check_max_seqlen(name, cu, mx, torch_side):
    """max_seqlen_* as an int must cover every sequence of cu (skipped while torch.compile traces)."""
    if torch_side and _ops().torch.compiler.is_compiling():
        return  # a data-dependent check would break the graph
    if isinstance(mx, int) and cu.shape[0] > 1:
        longest = int((cu[1:] - cu[:-1]).max())
        if longest > mx:
            raise ValueError(f"{name} = {mx} but a sequence has {longest} rows")


def _varlen_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_k, block_table, t, opts, alibi_slopes,
                  return_attn_probs, sinks):
    """flash_attn_varlen_func with block_table: packed q over a paged KV cache, no append."""
    if opts.dropout_p > 0.0:
        raise ValueError("flash_attn_varlen_func: dropout does not apply with block_table (paged KV caches are "
                         "inference-only)")
    _need_ndim(q, 3, "q", "(total_q, nheads, headdim)")
    for name, x in (("k", k), ("v", v)):
        _need_ndim(x, 4, name, "(num_pages, page_size, nheads_k, headdim) with block_table")
    cu_q, cu_k = _int32(cu_seqlens_q, t, "cu_seqlens_q"), _int32(cu_seqlens_k, t, "cu_seqlens_k")
    if cu_q.ndim != 1 or cu_k.ndim != 1 or cu_q.shape[0] != cu_k.shape[0] or cu_q.shape[0] < 1:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be 1-d (batch + 1,) of the same length")
    _check_max_seqlen("max_seqlen_q", cu_q, max_seqlen_q, t)
    if seqused_k is not None:
        seqlens = _int32(seqused_k, t, "seqused_k")
    else:
        seqlens = cu_k[1:] - cu_k[:-1]  # the library checks each is >= 0 and fits the sequence's pages
    seqlens = seqlens.contiguous() if t else np.ascontiguousarray(seqlens)
    table = _int32(block_table, t, "block_table")
    if table.ndim != 2 or table.shape[0] != cu_q.shape[0] - 1:
        raise ValueError(f"block_table must be (batch, max_pages) with batch = {cu_q.shape[0] - 1}, got shape "
                         f"{tuple(table.shape)}")
    total, H = q.shape[0], q.shape[1]
    if t:
        import torch

        q, k, v = q.detach(), k.detach(), v.detach()
        out = torch.empty((1, total, H, v.shape[3]), dtype=q.dtype)
        lse = torch.empty((1, H, total), dtype=torch.float32) if return_attn_probs else None
    else:
        q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
        out = np.empty((1, total, H, v.shape[3]), dtype=q.dtype)
        lse = np.empty((1, H, total), dtype=np.float32) if return_attn_probs else None
    _C.forward(_core.current_context(), q[None], None, None, out, lse, opts=opts,
               alibi_slopes=_alibi(alibi_slopes, t), cu_seqlens_q=cu_q, k_cache=k, v_cache=v, cache_seqlens=seqlens,
               block_table=table, sinks=None if sinks is None else _sinks(sinks, t).detach() if t else _sinks(sinks, t))
    return (out[0], lse[0], None) if return_attn_probs else out[0]


def _cache_index(batch, cache_seqlens, cache_batch_idx, block_table, torch_side):
    """A cache call's int32 index arrays: (seqlens, batch_idx, block_table)."""
    if cache_seqlens is None:
        raise ValueError("flash_attn_with_kvcache: cache_seqlens is required (an int or int32 (batch,))")
    if isinstance(cache_seqlens, int):
        cache_seqlens = np.full((batch,), cache_seqlens, dtype=np.int32)
    return (_int32(cache_seqlens, torch_side, "cache_seqlens"), _int32(cache_batch_idx, torch_side, "cache_batch_idx"),
            _int32(block_table, torch_side, "block_table"))


# kv blocks of a tree mask's block mask: the cache before the tree is whole blocks of
# this many keys, the one or two blocks the tree meets carry element bits
_TREE_BLOCK_K = 128


def _tree_block_mask(tree_mask, seqlens, leftpad, n_appended, n_rows):
    """flash_attn_with_kvcache's tree_mask as the binding's block_mask tuple.

    tree_mask (n, n) or (batch, n, n) bool, n = seqlen_q: query row i (draft token i)
    sees draft token j when tree_mask[i, j] (its ancestors and itself); every row sees
    the sequence's keys before the draft tokens. The draft tokens are the last n keys of
    each sequence after the append (the new rows k, v, or the cache's last n keys when
    nothing is appended), keys counting after any left padding, as the library's block
    mask on a cache does (docs/semantics.md, "Block mask"). One q block of n rows; per
    sequence its whole blocks before the tree, then element bits for the blocks the tree
    meets."""
    tm = np.asarray(tree_mask.detach().cpu().numpy() if hasattr(tree_mask, "detach") else tree_mask)
    if tm.dtype != np.bool_ or tm.ndim not in (2, 3) or tm.shape[-1] != tm.shape[-2] or tm.shape[-1] != n_rows:
        raise ValueError(f"flash_attn_with_kvcache: tree_mask must be bool (seqlen_q, seqlen_q) or (batch, seqlen_q, "
                         f"seqlen_q) for seqlen_q = {n_rows}, got {tm.dtype} {tuple(tm.shape)}")
    lens = np.asarray(seqlens.cpu().numpy() if hasattr(seqlens, "cpu") else seqlens, dtype=np.int64) + n_appended
    if leftpad is not None:
        lens = lens - np.asarray(leftpad.cpu().numpy() if hasattr(leftpad, "cpu") else leftpad, dtype=np.int64)
    B = lens.shape[0]
    if tm.ndim == 3 and tm.shape[0] not in (1, B):
        raise ValueError(f"flash_attn_with_kvcache: tree_mask has {tm.shape[0]} masks for a batch of {B}")
    if (lens < n_rows).any():
        raise ValueError(f"flash_attn_with_kvcache: tree_mask: every sequence needs at least seqlen_q = {n_rows} keys "
                         "(the draft tokens) after the append")
    n, bk = n_rows, _TREE_BLOCK_K
    per_b = tm.ndim == 3 and tm.shape[0] > 1
    rows = B if per_b or (lens != lens[0]).any() else 1
    offsets, kv, partial, bits = [0], [], [], []
    for b in range(rows):
        L = int(lens[b])
        prefix = L - n
        whole = prefix // bk
        kv.append(np.arange(whole, dtype=np.int32))
        partial.append(np.full(whole, -1, dtype=np.int64))
        last = -(-L // bk)
        j = np.arange(whole * bk, last * bk)
        keep = np.zeros((n, j.size), dtype=np.bool_)
        keep[:, j < prefix] = True
        tree = (j >= prefix) & (j < L)
        keep[:, tree] = (tm[b] if per_b else tm.reshape(-1, n, n)[0])[:, j[tree] - prefix]
        blocks = keep.reshape(n, last - whole, bk).transpose(1, 0, 2)
        first = sum(x.shape[0] for x in bits)
        kv.append(np.arange(whole, last, dtype=np.int32))
        partial.append(np.arange(first, first + blocks.shape[0], dtype=np.int64))
        bits.append(blocks)
        offsets.append(offsets[-1] + last)
    packed = np.packbits(np.concatenate(bits), axis=-1, bitorder="little").reshape(-1)
    return (n, bk, rows, 1, 1, np.asarray(offsets, dtype=np.int64), np.concatenate(kv), np.concatenate(partial),
            packed)


def _rotate(x, cos, sin, pos, interleaved, t):
    """x (batch, seqlen, nheads, headdim) with its first rotary_dim = 2 * cos.shape[1] dims
    rotated at positions pos (batch, seqlen): pairs (2i, 2i + 1) when interleaved, else
    (i, i + rotary_dim / 2); in fp32, rounded back to x's dtype. A new array."""
    half = cos.shape[1]
    rd = 2 * half
    if t:
        import torch

        c, s = cos.to(torch.float32)[pos][:, :, None, :], sin.to(torch.float32)[pos][:, :, None, :]
        xf = x[..., :rd].to(torch.float32)
    else:
        c, s = np.asarray(cos, np.float32)[pos][:, :, None, :], np.asarray(sin, np.float32)[pos][:, :, None, :]
        xf = x[..., :rd].astype(np.float32)
    x1, x2 = (xf[..., 0::2], xf[..., 1::2]) if interleaved else (xf[..., :half], xf[..., half:])
    r1, r2 = x1 * c - x2 * s, x1 * s + x2 * c
    if t:
        rot = torch.stack((r1, r2), -1).flatten(-2) if interleaved else torch.cat((r1, r2), -1)
        out = x.clone()
        out[..., :rd] = rot.to(x.dtype)
        return out
    rot = np.stack((r1, r2), -1).reshape(xf.shape) if interleaved else np.concatenate((r1, r2), -1)
    out = np.array(x, copy=True)
    out[..., :rd] = rot.astype(x.dtype)
    return out


def _rotate_qk(q, k, cos, sin, seqlens, q_advances, interleaved, t):
    """flash-attn's rotary embedding of a KV-cache call: new key i of sequence b at position
    seqlens[b] + i; query row i there too when causal or windowed (q_advances), else at
    seqlens[b]. Returns the rotated (q, k)."""
    _need_ndim(k, 4, "k", "(batch, seqlen_new, nheads_k, headdim)")
    if cos.ndim != 2 or tuple(sin.shape) != tuple(cos.shape):
        raise ValueError(f"rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2), got "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    if 2 * cos.shape[1] > q.shape[3] or 2 * cos.shape[1] > k.shape[3]:
        raise ValueError(f"rotary_dim = {2 * cos.shape[1]} exceeds headdim {q.shape[3]}")
    if t:
        import torch

        start = seqlens.to(torch.int64)[:, None]
        qi, ki = torch.arange(q.shape[1])[None, :], torch.arange(k.shape[1])[None, :]
    else:
        start = seqlens.astype(np.int64)[:, None]
        qi, ki = np.arange(q.shape[1])[None, :], np.arange(k.shape[1])[None, :]
    kpos = start + ki
    qpos = start + qi if q_advances else start + 0 * qi
    used = [x for x in (kpos, qpos) if (x.numel() if t else x.size) > 0]
    if any(int(x.min()) < 0 for x in used):
        raise ValueError("cache_seqlens must be >= 0")
    top = max([int(x.max()) for x in used] or [-1])
    if top >= cos.shape[0]:
        raise ValueError(f"rotary_cos has {cos.shape[0]} rows; positions up to {top} are needed")
    return _rotate(q, cos, sin, qpos, interleaved, t), _rotate(k, cos, sin, kpos, interleaved, t)


def _cache_scale(scale, descale, cache, B, batch_idx, block_table, name):
    """A torch cache's scale tensor as the library takes it, (.., .., nheads_k, 1) f32: a
    float or a 0-d tensor (one per tensor) or (nheads_k,) (one per head) broadcast with
    token stride 0; flash-attn 3's descale (batch, nheads_k) as one per cache row and
    head; (.., .., nheads_k) or 4-d as given."""
    import torch

    if descale is not None:
        if scale is not None:
            raise ValueError(f"flash_attn_with_kvcache: give {name}_scale or {name}_descale, not both")
        if batch_idx is not None or block_table is not None or cache.shape[0] != B:
            raise ValueError(f"flash_attn_with_kvcache: {name}_descale (batch, nheads_k) needs a contiguous cache "
                             f"of batch rows without cache_batch_idx; give {name}_scale instead")
        d = torch.as_tensor(descale, dtype=torch.float32)
        return d.reshape(B, 1, cache.shape[2], 1).expand(B, cache.shape[1], cache.shape[2], 1)
    if scale is None:
        return None
    s = torch.as_tensor(scale) if not isinstance(scale, torch.Tensor) else scale
    if s.dim() == 0 or (s.dim() == 1 and s.shape[0] == cache.shape[2]):
        s = s.to(torch.float32).reshape(1, 1, -1, 1)
        return s.expand(cache.shape[0], cache.shape[1], cache.shape[2], 1)
    return s


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
                            *, k_scale=None, v_scale=None, k_descale=None, v_descale=None, sinks=None,
                            tree_mask=None, quant_matmul=None, f32_matmul=None):
    """Attention of q (batch, seqlen_q, nheads, headdim) over a KV cache, appending k, v first.

    k_cache, v_cache: (batch_cache, seqlen_max, nheads_k, headdim[_v]), or with
    block_table (batch, max_pages) int32 page pools (num_pages, page_size, nheads_k,
    headdim[_v]) of any page size. k, v (batch, seqlen_new, nheads_k, ...) are written
    in place at cache_seqlens[b] (an int or int32 (batch,)), which the caller advances
    afterwards, as in flash-attn. causal is bottom-right over the valid keys.
    cache_leftpad (batch,) int32, contiguous caches only: sequence b's keys start at row
    cache_leftpad[b] of its cache row (the rows before are never read) and end at
    cache_seqlens[b], which still counts from the row's start, as in flash-attn.
    rotary_cos, rotary_sin (seqlen_ro, rotary_dim / 2), with k and v only: the first
    rotary_dim dims of q and of the new k are rotated before the call (in fp32, then
    rounded to their dtype), pairs (0, 1), (2, 3), ... with rotary_interleaved, else
    (i, i + rotary_dim / 2) (GPT-NeoX), at flash-attn's positions: new key i of
    sequence b at cache_seqlens[b] + i, query row i there too when causal or windowed,
    else every query row at cache_seqlens[b] (cache_leftpad does not move them).
    Beyond flash-attn: int8 and fp8 (torch.float8_e4m3fn, float8_e5m2) caches, whose
    elements are scale * code. k_scale, v_scale: fp32 per (token, kv head), shaped
    (.., .., nheads_k) like the cache (appends write each new row's max|x| / FMAX,
    FMAX = 127, 448, 57344), or broadcast along the tokens (an expand()ed view with
    token stride 0, a float, or a (nheads_k,) tensor: one scale per tensor or head,
    which appends quantise with and never write). k_descale, v_descale (fp8 only,
    flash-attn 3's names): (batch, nheads_k) fp32, one scale per sequence and kv head,
    for contiguous caches without cache_batch_idx (docs/semantics.md, section 8). sinks (nheads,) as in
    flash_attn_func, added once per row however the keys are split. Not differentiable.
    num_splits: 1..256 cuts each sequence's keys into that many split-KV chunks for this
    call (fa_forward_args.kv_splits); 0 leaves it to the context (planned by default).
    tree_mask (speculative decoding: a draft-token tree verified in one call), bool
    (seqlen_q, seqlen_q) or (batch, seqlen_q, seqlen_q): the query rows are the draft
    tokens, which are the last seqlen_q keys of each sequence after the append; row i
    sees every key before them and draft token j where tree_mask[i, j] (its ancestors
    and itself). It combines with causal and windows by AND (pass causal=False for the
    tree alone); the library's block mask carries it (docs/semantics.md, "Block mask").
    quant_matmul as in flash_attn_func: with an int8 cache, "i8" / "i8x2" decode with
    integer products (docs/semantics.md, section 11). f32_matmul as in flash_attn_func.
    """
    if (rotary_cos is None and rotary_sin is None and alibi_slopes is None and sinks is None and k_scale is None and
            v_scale is None and k_descale is None and v_descale is None and not return_softmax_lse and
            tree_mask is None):
        # Decoding's per-call path: CPU torch tensors and int32 index arrays as they
        # come, every check in one binding call (_C.kvcache_torch, lenient), which
        # answers None for whatever the general path below converts or refuses. A
        # decoding step's Python runs on caches the kernel has just flushed, so each
        # step saved here is worth several microseconds (binding.cpp).
        opts = _options(0.0, softmax_scale, causal, window_size, softcap, None, 0, True)
        if num_splits:
            opts = opts._replace(kv_splits=num_splits)
        if quant_matmul is not None:
            opts = _quant(opts, quant_matmul)
        opts = _f32mm(opts, f32_matmul, q, is_torch(q))
        out = _kvcache_torch(_current_context(), q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx,
                             block_table, cache_leftpad, None, None, opts, True)
        if out is not None:
            return out
    t = is_torch(q)
    opts = _f32mm(_quant(_options(0.0, softmax_scale, causal, window_size, softcap, None, 0, t), quant_matmul),
                  f32_matmul, q, t)
    if num_splits:
        opts = opts._replace(kv_splits=num_splits)
    _need_ndim(q, 4, "q", "(batch, seqlen_q, nheads, headdim)")
    B = q.shape[0]
    seqlens, bidx, table = _cache_index(B, cache_seqlens, cache_batch_idx, block_table, t)
    leftpad = _int32(cache_leftpad, t, "cache_leftpad")
    if rotary_cos is not None or rotary_sin is not None:
        if rotary_cos is None or rotary_sin is None or k is None:
            raise ValueError("flash_attn_with_kvcache: rotary embedding needs rotary_cos, rotary_sin and the new "
                             "rows k, v (as in flash-attn)")
        q, k = _rotate_qk(q, k, rotary_cos, rotary_sin, seqlens,
                          opts.causal != _core.CAUSAL_NONE or opts.window_left >= 0 or opts.window_right >= 0,
                          bool(rotary_interleaved), t)
    if t:
        k_scale = _cache_scale(k_scale, k_descale, k_cache, B, cache_batch_idx, block_table, "k")
        v_scale = _cache_scale(v_scale, v_descale, v_cache, B, cache_batch_idx, block_table, "v")
    if t:
        import torch

        # the cache is written in place and the call is not differentiable (detach only
        # what takes a gradient: a decoding step's per-call cost is counted in microseconds)
        q, k, v = (x.detach() if x is not None and x.requires_grad else x for x in (q, k, v))
        for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
            if x.device.type != "cpu":
                raise ValueError(f"{name} is on {x.device}; flashattn runs on CPU tensors only")
        if not return_softmax_lse and alibi_slopes is None and sinks is None and tree_mask is None:
            return _ops().kvcache_lean(q, k_cache, v_cache, k, v, seqlens, bidx, table, leftpad, k_scale, v_scale,
                                       opts)
        out = torch.empty((B, q.shape[1], q.shape[2], v_cache.shape[3]), dtype=q.dtype)
        lse = torch.empty((B, q.shape[2], q.shape[1]), dtype=torch.float32) if return_softmax_lse else None
    else:
        q, k, v = _np(q, "q"), _np(k, "k"), _np(v, "v")
        out = np.empty((B, q.shape[1], q.shape[2], v_cache.shape[3]), dtype=q.dtype)
        lse = np.empty((B, q.shape[2], q.shape[1]), dtype=np.float32) if return_softmax_lse else None
    sinks = _sinks(sinks, t)
    if t and sinks is not None:
        sinks = sinks.detach()
    args = (q, k, v, out, lse, _alibi(alibi_slopes, t), k_cache, v_cache, k_scale, v_scale, seqlens, bidx, table,
            sinks, leftpad)
    if t:
        # DLPack capsules: ~0.2 us each against ~2 us through Tensor.__dlpack__ (decoding calls are short)
        from torch.utils.dlpack import to_dlpack

        args = tuple(None if x is None else to_dlpack(x) for x in args)
    q_, k_, v_, out_, lse_, alibi_, kc_, vc_, ks_, vs_, seqlens_, bidx_, table_, sinks_, leftpad_ = args
    tree = None
    if tree_mask is not None:
        tree = _tree_block_mask(tree_mask, seqlens, leftpad, 0 if k is None else k.shape[1], q.shape[1])
    _C.forward(_core.current_context(), q_, k_, v_, out_, lse_, opts=opts, alibi_slopes=alibi_, k_cache=kc_,
               v_cache=vc_, k_scale=ks_, v_scale=vs_, cache_seqlens=seqlens_, cache_batch_idx=bidx_,
               block_table=table_, sinks=sinks_, cache_leftpad=leftpad_, block_mask=tree)
    return (out, lse) if return_softmax_lse else out


def merge_states(out_parts, lse_parts, out_dtype=None):
    """Merges partial results over disjoint key sets: out_parts[i] (batch, seqlen, nheads, headdim_v),
    lse_parts[i] (batch, nheads, seqlen) fp32. Returns (out, lse) with
    lse = log(sum_i exp(lse_i)) and out = sum_i exp(lse_i - lse) out_i."""
    out_parts, lse_parts = list(out_parts), list(lse_parts)
    if not out_parts or len(out_parts) != len(lse_parts):
        raise ValueError("merge_states needs one or more parts, as many lse parts as output parts")
    o0 = out_parts[0]
    if o0.ndim != 4:
        raise ValueError(f"out parts must be (batch, seqlen, nheads, headdim_v), got shape {tuple(o0.shape)}")
    B, S, H, Dv = o0.shape
    if is_torch(o0):
        import torch

        out = torch.empty((B, S, H, Dv), dtype=out_dtype or o0.dtype)
        lse = torch.empty((B, H, S), dtype=torch.float32)
        out_parts = [x.detach() for x in out_parts]
        lse_parts = [x.detach() for x in lse_parts]
    else:
        out_parts = [np.asarray(x) for x in out_parts]
        lse_parts = [np.asarray(x) for x in lse_parts]
        out = np.empty((B, S, H, Dv), dtype=out_dtype or out_parts[0].dtype)
        lse = np.empty((B, H, S), dtype=np.float32)
    _C.merge_states(_core.current_context(), out_parts, lse_parts, out, lse)
    return out, lse


def tune(q, k, v, causal=False, window_size=(-1, -1), softmax_scale=None, softcap=0.0, *, tile_qs=None,
         tile_kvs=None, runs=0, save=True, path=None, progress=None):
    """Finds the fastest flash tile sizes for this call's shape class and saves them.

    The library's fa_tune (include/flashattn.h): times the forward of q (batch, seqlen_q,
    nheads, headdim), k, v (batch, seqlen_k, nheads_k, headdim[_v]) on the current
    context with the planner's own tiles and with every pair of tile_qs x tile_kvs
    (default {16..256} x {32..512}), each one warm-up then `runs` timed runs (0: 3),
    and saves the fastest pair in the tune file, which later contexts read for calls of
    the same class (CPU, ISA path, dtype, head dims, length buckets, masking). `path`
    overrides the file ($FLASHATTN_TUNE_FILE, else ~/.cache/flashattn/tune.txt);
    save=False only times. `progress(done, total, tile_q, tile_kv, ms)` is called after
    each candidate (ms None: out of memory). NumPy arrays or CPU torch tensors (no
    gradient is taken).

    Returns a dict: "best" and "heuristic" ({"tile_q", "tile_kv", "asked_q", "asked_kv",
    "ms"}), "saved_tiles", "saved", "path", "key", "cpu", "note", "threads", "runs" and
    "timings" (every distinct pair, fastest first). A file that is not a tune file, or
    one that cannot be written, raises OSError.
    """
    t = is_torch(q)
    opts = _options(0.0, softmax_scale, causal, window_size, softcap, None, 0, t)
    if t:
        out = q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))
        q, k, v, out = q.detach(), k.detach(), v.detach(), out.detach()
    else:
        q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
        for name, x in (("q", q), ("k", k), ("v", v)):
            _need_ndim(x, 4, name, "(batch, seqlen, nheads, headdim)")
        out = np.empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), dtype=q.dtype)
    def report(done, total, tile_q, tile_kv, ms):
        progress(done, total, tile_q, tile_kv, None if ms != ms else ms)

    return _C.tune(_core.current_context(), [int(x) for x in tile_qs or ()], [int(x) for x in tile_kvs or ()],
                   int(runs), bool(save), None if path is None else str(path), None if progress is None else report,
                   q, k, v, out, opts=opts)


def forward_work(q, k, v, causal=False, window_size=(-1, -1), *, cu_seqlens_q=None, cu_seqlens_k=None,
                 k_cache=None, v_cache=None, cache_seqlens=None, cache_batch_idx=None, block_table=None, k_scale=None,
                 v_scale=None):
    """The work of a forward call, by the library's one FLOP rule (fa_forward_work,
    docs/semantics.md section 9): a dict with "pairs", the (i, j) pairs the causal and
    window band keeps summed over batch (or sequences) and query heads, "flops"
    (2 * (headdim + headdim_v) per pair) and "backward_flops" (2.5 times flops; a
    training step is flops + backward_flops). Nothing runs and nothing is written.

    The arguments and layouts are those of the call being counted: flash_attn_func's
    (q (batch, seqlen_q, nheads, headdim), k, v (batch, seqlen_k, nheads_k, ..)); with
    cu_seqlens_q, cu_seqlens_k flash_attn_varlen_func's (q, k, v (total, nheads, ..),
    each sequence counted at its own lengths); with k_cache, v_cache
    flash_attn_with_kvcache's (k, v the new rows or None; keys counted after the
    append). causal and window_size as there. NumPy arrays or CPU torch tensors. A call
    the library would refuse raises what the call would.
    """
    t = is_torch(q)
    opts = _options(0.0, None, causal, window_size, 0.0, None, 0, t)
    if t:
        q, k, v, k_cache, v_cache = (None if x is None else x.detach() for x in (q, k, v, k_cache, v_cache))
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen:
        # packed (total, nheads, headdim): the library's batch of one
        q, k, v = (None if x is None else x[None] for x in (q, k, v))
        cu_q, cu_k = _int32(cu_seqlens_q, t, "cu_seqlens_q"), _int32(cu_seqlens_k, t, "cu_seqlens_k")
    else:
        cu_q = cu_k = None
    seqlens = bidx = table = None
    if k_cache is not None or v_cache is not None:
        seqlens, bidx, table = _cache_index(q.shape[0], cache_seqlens, cache_batch_idx, block_table, t)
    # Nothing is written: a stride-0 view of one float32 stands in for out (the
    # library takes an f32 out for any q), whatever the call's size.
    Dv = (v_cache if v_cache is not None else v).shape[-1]
    out = np.lib.stride_tricks.as_strided(np.empty(1, np.float32), (q.shape[0], q.shape[1], q.shape[2], Dv),
                                          (0, 0, 0, 0), writeable=True)
    return _C.forward_work(_core.current_context(), q, k, v, out, opts=opts, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                           k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale, cache_seqlens=seqlens,
                           cache_batch_idx=bidx, block_table=table)
