"""flashattn.torch._ops: the torch.library custom ops flashattn::fwd and flashattn::bwd.

Owns the differentiable attention for torch tensors: fwd returns (out, lse,
dropout_mask) from q, k, v in (batch, seq, heads, dim) of any strides; bwd runs
fa_backward from the saved q, k, v, out, lse and the same options, so autograd
never holds an N x N matrix. Both have fake (meta) implementations so that
torch.compile traces through them without graph breaks.

Eager calls skip the dispatcher, whose Python custom-op path costs some 100 us
per call: without a gradient attention() calls the library directly (and
forward_lean / sdpa_lean, the per-call minimum, do for flash_attn_func and SDPA),
with one it uses _Attention, a torch.autograd.Function over the very same two
implementations. Tensors reach the binding as DLPack capsules
(torch.utils.dlpack.to_dlpack, ~0.2 us) rather than through Tensor.__dlpack__
(~2 us each).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from torch.utils.dlpack import to_dlpack as _to_dlpack

from .. import _C, _core


def _dl(x):
    return None if x is None else _to_dlpack(x)


# Bound once: each module attribute lookup is a measurable part of a ~5 us call.
_forward = _C.forward
_context = _core.current_context
_empty = torch.empty
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_profiling = torch.autograd._profiler_enabled
_f32, _bool = torch.float32, torch.bool
_C.torch_setup(_to_dlpack, torch.empty_strided, torch.Tensor)
_forward_torch = _C.forward_torch
_kvcache_torch = _C.kvcache_torch


def _cpu(x, name):
    if x is not None and x.device.type != "cpu":
        raise ValueError(f"{name} is on {x.device}; flashattn runs on CPU tensors only")


def _fwd_impl(q, k, v, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, scale, softcap, causal, window_left,
              window_right, dropout_p, seed, offset, return_mask, sinks=None, lean=False):
    # lean (inference without read-outs): no lse and no placeholder mask, each
    # allocation being ~1 us of a ~5 us small call
    B, Sq, Hq, _ = q.shape
    out = _empty(B, Sq, Hq, v.shape[3], dtype=q.dtype)  # the varargs form parses faster than a tuple
    lse = None if lean else _empty(B, Hq, Sq, dtype=_f32)
    dm = _empty(B, Hq, Sq, k.shape[1], dtype=_bool) if return_mask else (None if lean else _empty(0, dtype=_bool))
    dl = _to_dlpack
    _forward(_context(), dl(q), dl(k), dl(v), dl(out), None if lean else dl(lse), scale, softcap, causal,
             window_left, window_right, _dl(alibi_slopes), _dl(bias), _dl(mask), _dl(cu_seqlens_q),
             _dl(cu_seqlens_k), None, None, None, None, None, None, None, 0, 0, dropout_p, seed, offset,
             dl(dm) if return_mask else None, _dl(sinks))
    return out, lse, dm


def _bwd_impl(dout, q, k, v, out, lse, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, scale, softcap, causal,
              window_left, window_right, dropout_p, seed, offset, sinks=None):
    # Fresh row-major outputs: empty_like would copy the strides of a transposed q.
    dq = torch.empty(q.shape, dtype=q.dtype)
    dk = torch.empty(k.shape, dtype=k.dtype)
    dv = torch.empty(v.shape, dtype=v.dtype)
    # the sinks' gradient, (nheads,) f32; an empty tensor stands for "no sinks"
    dsinks = torch.empty(q.shape[2] if sinks is not None else 0, dtype=_f32)
    _C.backward(_core.current_context(), _dl(dout), _dl(dq), _dl(dk), _dl(dv), _dl(q), _dl(k), _dl(v), _dl(out),
                _dl(lse), scale, softcap, causal, window_left, window_right, _dl(alibi_slopes), _dl(bias), _dl(mask),
                _dl(cu_seqlens_q), _dl(cu_seqlens_k), None, None, None, None, None, None, None, 0, 0, dropout_p, seed,
                offset, None, _dl(sinks), dsinks=_dl(dsinks) if sinks is not None else None)
    return dq, dk, dv, dsinks


@torch.library.custom_op("flashattn::fwd", mutates_args=(), device_types="cpu")
def fwd(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], mask: Optional[Tensor],
        alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], scale: float,
        softcap: float, causal: int, window_left: int, window_right: int, dropout_p: float, seed: int, offset: int,
        return_mask: bool, sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    return _fwd_impl(q, k, v, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, scale, softcap, causal,
                     window_left, window_right, dropout_p, seed, offset, return_mask, sinks)


@fwd.register_fake
def _(q, k, v, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, scale, softcap, causal, window_left,
      window_right, dropout_p, seed, offset, return_mask, sinks=None):
    B, Sq, Hq, _ = q.shape
    out = q.new_empty((B, Sq, Hq, v.shape[3]))
    lse = q.new_empty((B, Hq, Sq), dtype=torch.float32)
    dm = q.new_empty((B, Hq, Sq, k.shape[1]) if return_mask else (0,), dtype=torch.bool)
    return out, lse, dm


@torch.library.custom_op("flashattn::bwd", mutates_args=(), device_types="cpu")
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, bias: Optional[Tensor],
        mask: Optional[Tensor], alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
        cu_seqlens_k: Optional[Tensor], scale: float, softcap: float, causal: int, window_left: int,
        window_right: int, dropout_p: float, seed: int, offset: int,
        sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return _bwd_impl(dout, q, k, v, out, lse, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, scale, softcap,
                     causal, window_left, window_right, dropout_p, seed, offset, sinks)


@bwd.register_fake
def _(dout, q, k, v, out, lse, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, scale, softcap, causal,
      window_left, window_right, dropout_p, seed, offset, sinks=None):
    dsinks = q.new_empty((q.shape[2] if sinks is not None else 0,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


def _setup_context(ctx, inputs, output):
    (q, k, v, bias, mask, alibi, cu_q, cu_k, scale, softcap, causal, wl, wr, p, seed, offset, _) = inputs[:17]
    sinks = inputs[17] if len(inputs) > 17 else None  # a caller of the op from before sinks
    out, lse, _dm = output
    ctx.save_for_backward(q, k, v, out, lse, bias, mask, alibi, cu_q, cu_k, sinks)
    ctx.options = (scale, softcap, causal, wl, wr, p, seed, offset)


def _backward(ctx, dout, _dlse, _ddm):
    # lse and the dropout mask are read-outs: flash-attn gives them no gradient either.
    q, k, v, out, lse, bias, mask, alibi, cu_q, cu_k, sinks = ctx.saved_tensors
    dq, dk, dv, dsinks = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, bias, mask, alibi, cu_q, cu_k, *ctx.options,
                                                 sinks)
    return (dq, dk, dv) + (None,) * 14 + (dsinks if sinks is not None else None,)


torch.library.register_autograd("flashattn::fwd", _backward, setup_context=_setup_context)


class _Attention(torch.autograd.Function):
    """Eager autograd over _fwd_impl/_bwd_impl: what flashattn::fwd's registered
    autograd does, without the dispatcher's per-call cost."""

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, alibi, cu_q, cu_k, scale, softcap, causal, wl, wr, p, seed, offset, rm,
                sinks):
        out, lse, dm = _fwd_impl(q, k, v, bias, mask, alibi, cu_q, cu_k, scale, softcap, causal, wl, wr, p, seed,
                                 offset, rm, sinks)
        ctx.save_for_backward(q, k, v, out, lse, bias, mask, alibi, cu_q, cu_k, sinks)
        ctx.options = (scale, softcap, causal, wl, wr, p, seed, offset)
        ctx.mark_non_differentiable(lse, dm)
        return out, lse, dm

    @staticmethod
    def backward(ctx, dout, _dlse, _ddm):
        q, k, v, out, lse, bias, mask, alibi, cu_q, cu_k, sinks = ctx.saved_tensors
        dq, dk, dv, dsinks = _bwd_impl(dout, q, k, v, out, lse, bias, mask, alibi, cu_q, cu_k, *ctx.options, sinks)
        return (dq, dk, dv) + (None,) * 14 + (dsinks if sinks is not None else None,)


def _needs_op(q, k, v):
    # Compiling, or under torch.profiler: the dispatcher path, so that the graph and
    # the profile show flashattn::fwd / flashattn::bwd (the profiler is our msprof).
    # A gradient to take: autograd. Ordered by what an inference call pays.
    return ((_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)) or _is_compiling() or
            _profiling())


def _check(q, k, v, bias, mask):
    if not (q.is_cpu and k.is_cpu and v.is_cpu and (bias is None or bias.is_cpu) and
            (mask is None or mask.is_cpu)):
        for name, x in (("q", q), ("k", k), ("v", v), ("attn_mask", bias), ("attn_mask", mask)):
            _cpu(x, name)
    if not q.dim() == k.dim() == v.dim() == 4:
        for name, x in (("q", q), ("k", k), ("v", v)):
            if x.dim() != 4:
                raise ValueError(f"{name} must be 4-d (batch, seqlen, nheads, headdim), got shape {tuple(x.shape)}")
    if bias is not None and bias.requires_grad:
        raise ValueError("a float attn_mask that requires grad is not supported: flashattn gives no bias gradient")


def attention(q, k, v, bias, mask, alibi, cu_q, cu_k, opts, return_mask, need_lse=True, checked=False, sinks=None):
    """The torch entry of every dense and varlen call: (out, lse, dropout_mask); lse is
    None when not need_lse and no gradient is taken. checked: the caller (the SDPA
    route) has already made sure of devices, ranks and the mask's requires_grad.
    sinks: None, or (nheads,) float32 sink logits (a gradient flows to them)."""
    if not checked:
        _check(q, k, v, bias, mask)
    scale, softcap, causal, wl, wr, p, seed, offset = opts
    if _is_compiling() or _profiling():
        return torch.ops.flashattn.fwd(q, k, v, bias, mask, alibi, cu_q, cu_k, scale, softcap, causal, wl, wr, p, seed,
                                       offset, return_mask, sinks)
    if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                            (sinks is not None and sinks.requires_grad)):
        return _Attention.apply(q, k, v, bias, mask, alibi, cu_q, cu_k, scale, softcap, causal, wl, wr, p, seed,
                                offset, return_mask, sinks)
    return _fwd_impl(q, k, v, bias, mask, alibi, cu_q, cu_k, scale, softcap, causal, wl, wr, p, seed, offset,
                     return_mask, sinks, lean=not need_lse)


def forward_lean(q, k, v, opts):
    """out alone for a dense (batch, seqlen, nheads, dim) call without a mask that
    needs neither the custom op nor autograd (see _needs_op): one binding call
    (_C.forward_torch: to_dlpack, the output's torch.empty_strided and fa_forward,
    all from C++), no lse. None when the call needs more, or when the binding does
    not take the tensors (not on the CPU, not 4-d): the caller then takes
    attention(), which decides the same way and raises its own messages."""
    if _needs_op(q, k, v):
        return None
    scale, softcap, causal, wl, wr, p, seed, offset = opts
    return _forward_torch(_context(), q, k, v, None, None, scale, softcap, causal, wl, wr, p, seed, offset, False)


def kvcache_lean(q, k_cache, v_cache, k, v, seqlens, batch_idx, table, leftpad, k_scale, v_scale, scale, softcap,
                 causal, wl, wr):
    """flash_attn_with_kvcache's out alone on CPU tensors, in one binding call
    (_C.kvcache_torch: to_dlpack of every tensor, the output's torch.empty_strided and
    fa_forward, all from C++): decoding's per-call minimum. Index arrays int32."""
    return _kvcache_torch(_context(), q, k_cache, v_cache, k, v, seqlens, batch_idx, table, leftpad, k_scale, v_scale,
                          scale, softcap, causal, wl, wr)


def sdpa_lean(query, key, value, bias, mask, opts):
    """forward_lean for the SDPA route: query (N, Hq, L, E), key, value (N, Hk, S, E[v])
    or 3-d (N, L, E) as torch takes them, already checked (flashattn.torch._plan).
    The binding swaps the head and sequence axes in the strides (bnsd), so no view is
    made; out is (N, Hq, L, Ev), a transposed view of a (N, L, Hq, Ev) buffer as
    before (and as torch's own CPU flash kernel returns), or (N, L, Ev)."""
    if _needs_op(query, key, value):
        return None
    scale, softcap, causal, wl, wr, p, seed, offset = opts
    return _forward_torch(_context(), query, key, value, bias, mask, scale, softcap, causal, wl, wr, p, seed, offset,
                          True)
