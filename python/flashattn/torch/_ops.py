"""flashattn.torch._ops: the torch.library custom ops flashattn::fwd and flashattn::bwd.

Their schemas come from the C library's field table (include/flashattn.h), as the
library describes it (fa_args_field): the forward's arrays, then its options with
their defaults, so that an option added there is an argument here with no line changed.

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

import torch

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


# The ops' arguments, from the library's field table (flashattn._core.FORWARD_FIELDS):
# the forward's arrays (every INPUT field: q, k, v, then the optional ones in the
# struct's order), then every OPTION field with its C default, then return_mask. A
# field added to the table is an argument of both ops, with no line here.
_INPUTS = tuple(f["key"] for f in _core.FORWARD_FIELDS if f["role"] == _C.ROLE_INPUT)
_N_IN, _N_OPT = len(_INPUTS), len(_core.Options._fields)
_SINKS = _INPUTS.index("sinks")  # the one input besides q, k, v that takes a gradient
_OPTIONAL = _INPUTS[3:]
_Options = _core.Options


def _schema_args():
    required = ("q", "k", "v")
    arrays = [f"Tensor {key}" if key in required else f"Tensor? {key}=None" for key in _INPUTS]
    opts = []
    for f in _core.OPTION_FIELDS:
        kind = "int" if f["type"] in _core._INTEGER_TYPES else "float"
        opts.append(f"{kind} {f['key']}={_core._default(f)!r}")
    return arrays, opts


def _fwd_schema():
    arrays, opts = _schema_args()
    return "(" + ", ".join(arrays + opts + ["bool return_mask=False"]) + ") -> (Tensor, Tensor, Tensor)"


def _bwd_schema():
    arrays, opts = _schema_args()
    return ("(Tensor dout, " + ", ".join(arrays[:3] + ["Tensor out", "Tensor lse"] + arrays[3:] + opts) +
            ") -> (Tensor, Tensor, Tensor, Tensor)")


_NONE = (None,) * (_N_IN - 3)


def _keywords(inputs):
    """The optional inputs (after q, k, v) as the binding's keywords, DLPack capsules."""
    if inputs[3:] == _NONE:  # the usual call: a dict saved is ~0.5 us of a small call
        return {}
    return {key: _to_dlpack(x) for key, x in zip(_OPTIONAL, inputs[3:]) if x is not None}


def _fwd_impl(inputs, opts, return_mask, lean=False, block_mask=None):
    # inputs: in _INPUTS' order. lean (inference without read-outs): no lse and no
    # placeholder mask, each allocation being ~1 us of a ~5 us small call. block_mask:
    # None or the binding's tuple (flashattn.torch.flex)
    q, k, v = inputs[0], inputs[1], inputs[2]
    B, Sq, Hq, _ = q.shape
    out = _empty(B, Sq, Hq, v.shape[3], dtype=q.dtype)  # the varargs form parses faster than a tuple
    lse = None if lean else _empty(B, Hq, Sq, dtype=_f32)
    dm = _empty(B, Hq, Sq, k.shape[1], dtype=_bool) if return_mask else (None if lean else _empty(0, dtype=_bool))
    dl = _to_dlpack
    kw = _keywords(inputs)
    if return_mask:
        kw["dropout_mask"] = dl(dm)
    if block_mask is not None:
        kw["block_mask"] = block_mask
    _forward(_context(), dl(q), dl(k), dl(v), dl(out), None if lean else dl(lse), opts, **kw)
    return out, lse, dm


def _bwd_impl(dout, inputs, out, lse, opts, block_mask=None):
    q, k, v = inputs[0], inputs[1], inputs[2]
    sinks = inputs[_SINKS]
    # Fresh row-major outputs: empty_like would copy the strides of a transposed q.
    dq = torch.empty(q.shape, dtype=q.dtype)
    dk = torch.empty(k.shape, dtype=k.dtype)
    dv = torch.empty(v.shape, dtype=v.dtype)
    # the sinks' gradient, (nheads,) f32; an empty tensor stands for "no sinks"
    dsinks = torch.empty(q.shape[2] if sinks is not None else 0, dtype=_f32)
    _C.backward(_core.current_context(), _dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), opts=opts, dout=_dl(dout),
                dq=_dl(dq), dk=_dl(dk), dv=_dl(dv), dsinks=_dl(dsinks) if sinks is not None else None,
                block_mask=block_mask, **_keywords(inputs))
    return dq, dk, dv, dsinks


def _grads(dq, dk, dv, dsinks, sinks, extra):
    """One gradient per op input: q, k, v and the sinks take theirs, the rest None."""
    g = [dq, dk, dv] + [None] * (_N_IN - 3 + extra)
    g[_SINKS] = dsinks if sinks is not None else None
    return tuple(g)


torch.library.define("flashattn::fwd", _fwd_schema())
torch.library.define("flashattn::bwd", _bwd_schema())

# The dispatcher hands a Python kernel the arguments as given, trailing defaults left
# out and keywords as keywords: each kernel takes them back to the schema's full order.
_FWD_NAMES = _INPUTS + _core.Options._fields + ("return_mask",)
_FWD_DEFAULTS = (None,) * _N_IN + tuple(_core.DEFAULT_OPTIONS) + (False,)
_BWD_NAMES = ("dout",) + _INPUTS[:3] + ("out", "lse") + _INPUTS[3:] + _core.Options._fields
_BWD_DEFAULTS = (None,) * (_N_IN + 3) + tuple(_core.DEFAULT_OPTIONS)


def _full(args, kwargs, names, defaults):
    if not kwargs and len(args) == len(names):
        return tuple(args)
    return tuple(args) + tuple(kwargs.get(n, d) for n, d in zip(names[len(args):], defaults[len(args):]))


def _fwd_split(args, kwargs):
    """fwd's arguments: (inputs in _INPUTS' order, Options, return_mask)."""
    a = _full(args, kwargs, _FWD_NAMES, _FWD_DEFAULTS)
    return a[:_N_IN], _Options(*a[_N_IN:_N_IN + _N_OPT]), a[_N_IN + _N_OPT]


@torch.library.impl("flashattn::fwd", "cpu")
def fwd(*args, **kwargs):
    return _fwd_impl(*_fwd_split(args, kwargs))


@torch.library.register_fake("flashattn::fwd")
def _(*args, **kwargs):
    inputs, _, return_mask = _fwd_split(args, kwargs)
    q, k, v = inputs[0], inputs[1], inputs[2]
    B, Sq, Hq, _ = q.shape
    out = q.new_empty((B, Sq, Hq, v.shape[3]))
    lse = q.new_empty((B, Hq, Sq), dtype=torch.float32)
    dm = q.new_empty((B, Hq, Sq, k.shape[1]) if return_mask else (0,), dtype=torch.bool)
    return out, lse, dm


def _bwd_split(args, kwargs):
    """bwd's arguments: (dout, inputs in _INPUTS' order, out, lse, Options)."""
    args = _full(args, kwargs, _BWD_NAMES, _BWD_DEFAULTS)
    dout, q, k, v, out, lse = args[:6]
    rest = args[6:]
    inputs = (q, k, v) + tuple(rest[:_N_IN - 3])
    return dout, inputs, out, lse, _Options(*rest[_N_IN - 3:])


@torch.library.impl("flashattn::bwd", "cpu")
def bwd(*args, **kwargs):
    return _bwd_impl(*_bwd_split(args, kwargs))


@torch.library.register_fake("flashattn::bwd")
def _(*args, **kwargs):
    _, inputs, _, _, _ = _bwd_split(args, kwargs)
    q, k, v = inputs[0], inputs[1], inputs[2]
    dsinks = q.new_empty((q.shape[2] if inputs[_SINKS] is not None else 0,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


def _setup_context(ctx, inputs, output):
    ins, opts, _ = _fwd_split(inputs, {})
    out, lse, _dm = output
    ctx.save_for_backward(*ins, out, lse)
    ctx.options = tuple(opts)


def _backward(ctx, dout, _dlse, _ddm):
    # lse and the dropout mask are read-outs: flash-attn gives them no gradient either.
    saved = ctx.saved_tensors
    inputs, out, lse = saved[:_N_IN], saved[_N_IN], saved[_N_IN + 1]
    dq, dk, dv, dsinks = torch.ops.flashattn.bwd(dout, *inputs[:3], out, lse, *inputs[3:], *ctx.options)
    return _grads(dq, dk, dv, dsinks, inputs[_SINKS], _N_OPT + 1)


torch.library.register_autograd("flashattn::fwd", _backward, setup_context=_setup_context)


class _Attention(torch.autograd.Function):
    """Eager autograd over _fwd_impl/_bwd_impl: what flashattn::fwd's registered
    autograd does, without the dispatcher's per-call cost."""

    @staticmethod
    def forward(ctx, opts, return_mask, *inputs):
        out, lse, dm = _fwd_impl(inputs, opts, return_mask)
        ctx.save_for_backward(*inputs, out, lse)
        ctx.options = opts
        ctx.mark_non_differentiable(lse, dm)
        return out, lse, dm

    @staticmethod
    def backward(ctx, dout, _dlse, _ddm):
        saved = ctx.saved_tensors
        inputs, out, lse = saved[:_N_IN], saved[_N_IN], saved[_N_IN + 1]
        dq, dk, dv, dsinks = _bwd_impl(dout, inputs, out, lse, ctx.options)
        return (None, None) + _grads(dq, dk, dv, dsinks, inputs[_SINKS], 0)


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


# attention()'s arrays, by the table's keys, in _INPUTS' order
_ATTENTION_ARRAYS = ("q", "k", "v", "bias", "mask", "alibi_slopes", "cu_seqlens_q", "cu_seqlens_k", "sinks")
_ORDER = tuple(_ATTENTION_ARRAYS.index(key) for key in _INPUTS)


def _inputs(*given):
    """attention()'s arrays (q, k, v, bias, mask, alibi, cu_q, cu_k, sinks) in _INPUTS'
    order (the table's)."""
    return tuple([given[i] for i in _ORDER])


def attention(q, k, v, bias, mask, alibi, cu_q, cu_k, opts, return_mask, need_lse=True, checked=False, sinks=None):
    """The torch entry of every dense and varlen call: (out, lse, dropout_mask); lse is
    None when not need_lse and no gradient is taken. opts: a flashattn Options.
    checked: the caller (the SDPA route) has already made sure of devices, ranks and
    the mask's requires_grad. sinks: None, or (nheads,) float32 sink logits (a
    gradient flows to them)."""
    if not checked:
        _check(q, k, v, bias, mask)
    inputs = _inputs(q, k, v, bias, mask, alibi, cu_q, cu_k, sinks)
    if _is_compiling() or _profiling():
        return torch.ops.flashattn.fwd(*inputs, *opts, return_mask)
    if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                            (sinks is not None and sinks.requires_grad)):
        return _Attention.apply(opts, return_mask, *inputs)
    return _fwd_impl(inputs, opts, return_mask, lean=not need_lse)


def forward_lean(q, k, v, opts):
    """out alone for a dense (batch, seqlen, nheads, dim) call without a mask that
    needs neither the custom op nor autograd (see _needs_op): one binding call
    (_C.forward_torch: to_dlpack, the output's torch.empty_strided and fa_forward,
    all from C++), no lse. None when the call needs more, or when the binding does
    not take the tensors (not on the CPU, not 4-d): the caller then takes
    attention(), which decides the same way and raises its own messages."""
    if _needs_op(q, k, v):
        return None
    return _forward_torch(_context(), q, k, v, None, None, opts, False)


def kvcache_lean(q, k_cache, v_cache, k, v, seqlens, batch_idx, table, leftpad, k_scale, v_scale, opts):
    """flash_attn_with_kvcache's out alone on CPU tensors, in one binding call
    (_C.kvcache_torch: to_dlpack of every tensor, the output's torch.empty_strided and
    fa_forward, all from C++): decoding's per-call minimum. Index arrays int32."""
    return _kvcache_torch(_context(), q, k_cache, v_cache, k, v, seqlens, batch_idx, table, leftpad, k_scale, v_scale,
                          opts)


def sdpa_lean(query, key, value, bias, mask, opts):
    """forward_lean for the SDPA route: query (N, Hq, L, E), key, value (N, Hk, S, E[v])
    or 3-d (N, L, E) as torch takes them, already checked (flashattn.torch._plan).
    The binding swaps the head and sequence axes in the strides (bnsd), so no view is
    made; out is (N, Hq, L, Ev), a transposed view of a (N, L, Hq, Ev) buffer as
    before (and as torch's own CPU flash kernel returns), or (N, L, Ev)."""
    if _needs_op(query, key, value):
        return None
    return _forward_torch(_context(), query, key, value, bias, mask, opts, True)
