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


# Read once, at import (as the library reads it when a context is created): a
# per-call environment lookup would be a good part of a small call's cost.
_VERBOSE = os.environ.get("FLASHATTN_VERBOSE", "0") not in ("", "0")


def _verbose(line):
    if _VERBOSE:
        sys.stderr.write("flashattn.torch," + line + "\n")


def _why_not(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """None when flashattn can run this call exactly as torch defines it, else the reason.
    Ordered cheap-first: it runs on every routed call."""
    Tensor = torch.Tensor
    if not (isinstance(query, Tensor) and isinstance(key, Tensor) and isinstance(value, Tensor)):
        return "not a tensor"
    if attn_mask is not None and not isinstance(attn_mask, Tensor):
        return "not a tensor"
    if not (query.is_cpu and key.is_cpu and value.is_cpu and (attn_mask is None or attn_mask.is_cpu)):
        for t in (query, key, value, attn_mask):
            if t is not None and not t.is_cpu:
                return f"device {t.device.type}"
    dt = query.dtype
    if dt not in _FLOATS:
        return f"dtype {str(dt).replace('torch.', '')}"
    if key.dtype != dt or value.dtype != dt:
        return "mixed dtypes"
    qs, ks, vs = query.shape, key.shape, value.shape
    nd = len(qs)
    if nd not in (3, 4) or len(ks) != nd or len(vs) != nd:
        return "rank (3-d or 4-d q, k, v only)"
    if qs[0] != ks[0] or ks[:-1] != vs[:-1]:
        return "batch broadcast"
    if qs[-1] != ks[-1] or qs[-1] == 0:
        return "head dims"
    if nd == 4 and qs[1] != ks[1] and not (enable_gqa and ks[1] > 0 and qs[1] % ks[1] == 0):
        return "heads"
    if ks[-2] == 0:
        return "no keys"  # torch gives NaN rows; flashattn would give 0
    if attn_mask is not None:
        if is_causal:
            return "attn_mask with is_causal"  # torch raises; let it
        if attn_mask.requires_grad:
            return "attn_mask requires grad"
        md = attn_mask.dtype
        if md != torch.bool and md not in _FLOATS:
            return f"attn_mask dtype {str(md).replace('torch.', '')}"
        if md != torch.bool and md != dt:
            return "attn_mask dtype differs from query"  # torch refuses it
        if attn_mask.dim() > nd:
            return "attn_mask rank"
        target = tuple(qs[:-1]) + (ks[-2],)  # (N, Hq, L, S) or (N, L, S)
        for m, t in zip(reversed(attn_mask.shape), reversed(target)):
            if m != 1 and m != t:
                return "attn_mask shape"
    if scale is not None and float(scale) == 0.0:
        return "scale 0"
    if dropout_p and not 0.0 <= float(dropout_p) < 1.0:
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
    if _VERBOSE:
        _verbose(f"sdpa,routed,dtype:{str(q.dtype).replace('torch.', '')},B:{q.shape[0]},Hq:{q.shape[2]},"
                 f"Hk:{k.shape[2]},Sq:{q.shape[1]},Sk:{k.shape[1]},D:{q.shape[3]},Dv:{v.shape[3]},"
                 f"causal:{'top-left' if is_causal else 'none'},"
                 f"mask:{'none' if attn_mask is None else ('bool' if mask is not None else 'float')},dropout:{p},"
                 f"grad:{torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))}")
    out, _, _ = _ops.attention(q, k, v, bias, mask, None, None, None, opts, False, need_lse=False, checked=True)
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
