"""flashattn.torch: PyTorch's scaled_dot_product_attention on flashattn, and routing to it.

Owns:
  - scaled_dot_product_attention, with torch's exact signature and semantics
    (BNSD; bool or float attn_mask, broadcastable; dropout_p; is_causal top-left;
    scale; enable_gqa), differentiable through the flashattn::fwd custom op;
  - the routing of torch.nn.functional.scaled_dot_product_attention to it with a
    TorchFunctionMode (enable()/disable(), `with sdpa():`), no monkey-patching;
  - stats(): routed calls and fallbacks by reason, and the FLASHATTN_VERBOSE=1
    per-call line on stderr (the library's own verbose line follows it).
Whatever flashattn cannot take falls back to torch's own kernel, with a reason.
"""

import os
import sys
import threading

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .. import _core
from . import _ops

__all__ = ["scaled_dot_product_attention", "enable", "disable", "sdpa", "stats", "reset_stats", "is_enabled"]

_torch_sdpa = F.scaled_dot_product_attention
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)

_lock = threading.Lock()
_stats = {"routed": 0, "fallbacks": {}}


def _count(reason):
    with _lock:
        if reason is None:
            _stats["routed"] += 1
        else:
            _stats["fallbacks"][reason] = _stats["fallbacks"].get(reason, 0) + 1


def stats():
    """{"routed": calls flashattn ran, "fallbacks": {reason: calls torch ran}} since the last reset."""
    with _lock:
        return {"routed": _stats["routed"], "fallbacks": dict(_stats["fallbacks"])}


def reset_stats():
    with _lock:
        _stats["routed"] = 0
        _stats["fallbacks"] = {}


def _verbose(line):
    if os.environ.get("FLASHATTN_VERBOSE", "0") not in ("", "0"):
        sys.stderr.write("flashattn.torch," + line + "\n")


def _why_not(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """None when flashattn can run this call exactly as torch defines it, else the reason."""
    ts = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
    for t in ts:
        if not isinstance(t, torch.Tensor):
            return "not a tensor"
        if t.device.type != "cpu":
            return f"device {t.device.type}"
    if query.dtype not in _FLOATS:
        return f"dtype {str(query.dtype).replace('torch.', '')}"
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return "mixed dtypes"
    if query.dim() not in (3, 4) or key.dim() != query.dim() or value.dim() != query.dim():
        return "rank (3-d or 4-d q, k, v only)"
    if query.shape[:-3 if query.dim() == 4 else -2] != key.shape[:-3 if key.dim() == 4 else -2] or \
            key.shape[:-1] != value.shape[:-1]:
        return "batch broadcast"
    if query.shape[-1] != key.shape[-1] or query.shape[-1] == 0:
        return "head dims"
    if query.dim() == 4:
        hq, hk = query.shape[1], key.shape[1]
        if hq != hk and not (enable_gqa and hk > 0 and hq % hk == 0):
            return "heads"
    if key.shape[-2] == 0:
        return "no keys"  # torch gives NaN rows; flashattn would give 0
    if attn_mask is not None:
        if is_causal:
            return "attn_mask with is_causal"  # torch raises; let it
        if attn_mask.requires_grad:
            return "attn_mask requires grad"
        if attn_mask.dtype != torch.bool and attn_mask.dtype not in _FLOATS:
            return f"attn_mask dtype {str(attn_mask.dtype).replace('torch.', '')}"
        if attn_mask.dtype != torch.bool and attn_mask.dtype != query.dtype:
            return "attn_mask dtype differs from query"  # torch refuses it
        target = tuple(query.shape[:-1]) + (key.shape[-2],)  # (N, Hq, L, S) or (N, L, S)
        if attn_mask.dim() > query.dim():
            return "attn_mask rank"
        for m, t in zip(reversed(attn_mask.shape), reversed(target)):
            if m != 1 and m != t:
                return "attn_mask shape"
    if scale is not None and float(scale) == 0.0:
        return "scale 0"
    if not 0.0 <= float(dropout_p) < 1.0:
        return "dropout_p outside [0, 1)"
    return None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, computed by flashattn.

    query (N, Hq, L, E), key (N, Hk, S, E), value (N, Hk, S, Ev), or 3-d (N, L, E).
    Returns (N, Hq, L, Ev), a transposed view of a (N, L, Hq, Ev) buffer (as torch's
    own CPU flash kernel does). A call flashattn cannot take runs torch's kernel
    instead and is counted in stats()["fallbacks"].
    """
    reason = _why_not(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if reason is not None:
        _count(reason)
        _verbose(f"sdpa,fallback:{reason}")
        return _torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                           scale=scale, enable_gqa=enable_gqa)
    if query.dim() == 4:
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # BSND views, no copy
    else:
        q, k, v = query.unsqueeze(2), key.unsqueeze(2), value.unsqueeze(2)
    bias = mask = None
    if attn_mask is not None:
        m = attn_mask
        if query.dim() == 3:
            m = m.reshape((1,) * (3 - m.dim()) + tuple(m.shape)).unsqueeze(1)  # (N|1, 1, L|1, S|1)
        else:
            m = m.reshape((1,) * (4 - m.dim()) + tuple(m.shape))
        if m.dtype == torch.bool:
            mask = m
        else:
            bias = m
    p = float(dropout_p)
    seed = int(torch.randint(0, 2**62, (1,)).item()) if p > 0 else 0
    causal = _core.CAUSAL_TOP_LEFT if is_causal else _core.CAUSAL_NONE
    opts = (_core.scale_of(scale), 0.0, causal, -1, -1, p, seed, 0)
    _count(None)
    if os.environ.get("FLASHATTN_VERBOSE", "0") not in ("", "0"):
        _verbose(f"sdpa,routed,dtype:{str(q.dtype).replace('torch.', '')},B:{q.shape[0]},Hq:{q.shape[2]},"
                 f"Hk:{k.shape[2]},Sq:{q.shape[1]},Sk:{k.shape[1]},D:{q.shape[3]},Dv:{v.shape[3]},"
                 f"causal:{'top-left' if is_causal else 'none'},"
                 f"mask:{'none' if attn_mask is None else ('bool' if mask is not None else 'float')},dropout:{p},"
                 f"grad:{torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))}")
    out, _, _ = _ops.attention(q, k, v, bias, mask, None, None, None, opts, False, need_lse=False)
    return out.transpose(1, 2) if query.dim() == 4 else out.squeeze(2)


class _SDPAMode(TorchFunctionMode):
    """Sends torch.nn.functional.scaled_dot_product_attention to flashattn; every other
    function passes through untouched. torch pops the mode while its handler runs, so
    the fallback call reaches torch's kernel and not this mode again."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is _torch_sdpa:
            return scaled_dot_product_attention(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


_local = threading.local()


def _modes():
    m = getattr(_local, "modes", None)
    if m is None:
        m = _local.modes = []
    return m


def enable():
    """Routes torch.nn.functional.scaled_dot_product_attention on this thread to flashattn
    (torch's function-mode stack is per thread) until disable()."""
    mode = _SDPAMode()
    mode.__enter__()
    _modes().append(mode)


def disable():
    """Undoes the last enable() of this thread; a no-op without one."""
    modes = _modes()
    if modes:
        modes.pop().__exit__(None, None, None)


def is_enabled():
    return bool(_modes())


class sdpa:
    """`with flashattn.torch.sdpa():` routes SDPA to flashattn inside the block (this thread)."""

    def __enter__(self):
        enable()
        return self

    def __exit__(self, *exc):
        disable()
        return False
