"""flashattn.torch: PyTorch's scaled_dot_product_attention on flashattn, and routing to it.

Owns:
  - scaled_dot_product_attention, with torch's exact signature and semantics
    (BNSD; bool or float attn_mask, broadcastable; dropout_p; is_causal top-left;
    scale; enable_gqa), differentiable through the flashattn::fwd custom op;
  - the routing of torch.nn.functional.scaled_dot_product_attention to it with a
    TorchFunctionMode (enable()/disable(), `with sdpa():`), no monkey-patching;
  - stats(): routed calls and fallbacks by reason, and the FLASHATTN_VERBOSE=1
    per-call line on stderr (the library's own verbose line follows it);
  - the pool: from import on, flashattn's parallel work runs on torch's intra-op
    OpenMP pool, never on a second pool of its own beside it (set_pool, pool_info;
    FLASHATTN_TORCH_POOL=own at import keeps the library's own threads).
Whatever flashattn cannot take falls back to torch's own kernel, with a reason.
"""

import itertools
import os
import sys
import threading
import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .. import _C, _core
from ..interface import _f32mm, _torch_f32_mode
from . import _ops

__all__ = ["scaled_dot_product_attention", "enable", "disable", "sdpa", "stats", "reset_stats", "is_enabled",
           "set_pool", "pool_info"]

_torch_sdpa = F.scaled_dot_product_attention
_torch_f32_mode(torch)  # its precision reader, set up outside any torch.compile trace
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_bool = torch.bool
_Tensor = torch.Tensor

# Counting without a lock on the routed path (a lock is ~0.3 us of a ~5 us call):
# each thread counts into its own tally, [routed, {reason: calls}], which only that
# thread writes and which only grows. stats() sums the live threads' tallies and
# those retired by threads that have ended, minus the sums at the last
# reset_stats(). No update is lost and no thread writes another's tally. A
# thread's tally retires when the thread ends (its threading.local slot is freed,
# and with it the _Keeper whose finalizer folds the tally into _retired), so a
# program that starts many threads keeps one tally per live thread, not per thread
# ever started. The lock guards _live, _retired and the baseline.
_lock = threading.Lock()
_live = {}  # key -> tally of a live thread
_retired = [0, {}]
_baseline = (0, {})
_own = threading.local()
_keys = itertools.count()


class _Keeper:
    """Lives in a thread's threading.local slot: it dies with the thread."""

    __slots__ = ("__weakref__",)


def _fold(into, tally):
    into[0] += tally[0]
    for reason, n in tally[1].items():
        into[1][reason] = into[1].get(reason, 0) + n


def _retire(key, tally):
    with _lock:
        _live.pop(key, None)
        _fold(_retired, tally)


def _new_tally():
    tally, keeper, key = [0, {}], _Keeper(), next(_keys)
    with _lock:
        _live[key] = tally
    weakref.finalize(keeper, _retire, key, tally)
    _own.keeper = keeper
    _own.tally = tally
    return tally


def _count(reason):
    try:
        tally = _own.tally
    except AttributeError:
        tally = _new_tally()
    if reason is None:
        tally[0] += 1
    else:
        tally[1][reason] = tally[1].get(reason, 0) + 1


def _sums():
    # under _lock; the tallies' owners may be counting meanwhile (copies, then sums)
    total = [0, {}]
    _fold(total, _retired)
    for tally in list(_live.values()):
        _fold(total, [tally[0], dict(tally[1])])
    return total[0], total[1]


def stats():
    """{"routed": calls flashattn ran, "fallbacks": {reason: calls torch ran}} since the last reset."""
    with _lock:
        routed, fallbacks = _sums()
        base_routed, base_fallbacks = _baseline
    fallbacks = {r: n - base_fallbacks.get(r, 0) for r, n in fallbacks.items()}
    return {"routed": routed - base_routed, "fallbacks": {r: n for r, n in fallbacks.items() if n}}


def reset_stats():
    global _baseline
    with _lock:
        _baseline = _sums()


# Read once, at import (as the library reads it when a context is created): a
# per-call environment lookup would be a good part of a small call's cost.
_VERBOSE = os.environ.get("FLASHATTN_VERBOSE", "0") not in ("", "0")


def _verbose(line):
    if _VERBOSE:
        sys.stderr.write("flashattn.torch," + line + "\n")


def _why_not(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """None when flashattn can run this call exactly as torch defines it, else the reason."""
    plan = _plan(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return plan if type(plan) is str else None


def _plan(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """The reason (a str) when flashattn cannot run this call exactly as torch defines
    it, else the inputs' rank (4 or 3). Ordered cheap-first: it runs on every routed
    call; shapes are unpacked, not sliced (a torch.Size slice is a new object)."""
    Tensor = _Tensor
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
    if nd == 4 and len(ks) == 4 and len(vs) == 4:
        n, hq, l, e = qs
        kn, hk, s, ke = ks
        vn, vh, vsl, _ = vs
        if n != kn or kn != vn or hk != vh or s != vsl:
            return "batch broadcast"
    elif nd == 3 and len(ks) == 3 and len(vs) == 3:
        n, l, e = qs
        kn, s, ke = ks
        vn, vsl, _ = vs
        hq = hk = 1
        if n != kn or kn != vn or s != vsl:
            return "batch broadcast"
    else:
        return "rank (3-d or 4-d q, k, v only)"
    if e != ke or e == 0:
        return "head dims"
    if hq != hk and not (enable_gqa and hk > 0 and hq % hk == 0):
        return "heads"
    if s == 0:
        return "no keys"  # torch gives NaN rows; flashattn would give 0
    if attn_mask is not None:
        if is_causal:
            return "attn_mask with is_causal"  # torch raises; let it
        if attn_mask.requires_grad:
            return "attn_mask requires grad"
        md = attn_mask.dtype
        if md != _bool and md not in _FLOATS:
            return f"attn_mask dtype {str(md).replace('torch.', '')}"
        if md != _bool and md != dt:
            return "attn_mask dtype differs from query"  # torch refuses it
        if attn_mask.dim() > nd:
            return "attn_mask rank"
        target = (n, hq, l, s) if nd == 4 else (n, l, s)
        for m, t in zip(reversed(attn_mask.shape), reversed(target)):
            if m != 1 and m != t:
                return "attn_mask shape"
    if scale is not None and float(scale) == 0.0:
        return "scale 0"
    if dropout_p and not 0.0 <= float(dropout_p) < 1.0:
        return "dropout_p outside [0, 1)"
    return nd


_f32 = torch.float32
_PLAIN_OPTIONS = _core.DEFAULT_OPTIONS
_CAUSAL_OPTIONS = _core.Options(causal=_core.CAUSAL_TOP_LEFT)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, computed by flashattn.

    query (N, Hq, L, E), key (N, Hk, S, E), value (N, Hk, S, Ev), or 3-d (N, L, E).
    Returns (N, Hq, L, Ev), a transposed view of a (N, L, Hq, Ev) buffer (as torch's
    own CPU flash kernel does). A call flashattn cannot take runs torch's kernel
    instead and is counted in stats()["fallbacks"].
    """
    plan = _plan(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if type(plan) is str:
        reason = plan
        _count(reason)
        _verbose(f"sdpa,fallback:{reason}")
        return _torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                           scale=scale, enable_gqa=enable_gqa)
    nd = plan
    bias = mask = None
    if attn_mask is not None:
        m = attn_mask
        if nd == 3:
            m = m.reshape((1,) * (3 - m.dim()) + tuple(m.shape)).unsqueeze(1)  # (N|1, 1, L|1, S|1)
        elif m.dim() != 4:
            m = m.reshape((1,) * (4 - m.dim()) + tuple(m.shape))
        if m.dtype == _bool:
            mask = m
        else:
            bias = m
    if dropout_p:
        p = float(dropout_p)
        seed = int(torch.randint(0, 2**62, (1,)).item())
    else:
        p, seed = 0.0, 0
    if scale is None and not p:
        opts = _CAUSAL_OPTIONS if is_causal else _PLAIN_OPTIONS  # made once: a call is a few microseconds
    else:
        opts = _core.Options(scale=0.0 if scale is None else _core.scale_of(scale),
                             causal=_core.CAUSAL_TOP_LEFT if is_causal else _core.CAUSAL_NONE, dropout_p=p,
                             dropout_seed=seed)
    if query.dtype is _f32:  # torch's f32 matmul switch (docs/semantics.md, section 5)
        opts = _f32mm(opts, None, query, True)
    _count(None)
    if _VERBOSE:
        qs, ks, vs = query.shape, key.shape, value.shape
        h = (qs[1], ks[1]) if nd == 4 else (1, 1)
        _verbose(f"sdpa,routed,dtype:{str(query.dtype).replace('torch.', '')},B:{qs[0]},Hq:{h[0]},"
                 f"Hk:{h[1]},Sq:{qs[-2]},Sk:{ks[-2]},D:{qs[-1]},Dv:{vs[-1]},"
                 f"causal:{'top-left' if is_causal else 'none'},"
                 f"mask:{'none' if attn_mask is None else ('bool' if mask is not None else 'float')},dropout:{p},"
                 f"grad:{torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))}")
    out = _ops.sdpa_lean(query, key, value, bias, mask, opts)
    if out is not None:
        return out
    if nd == 4:
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # BSND views, no copy
    else:
        q, k, v = query.unsqueeze(2), key.unsqueeze(2), value.unsqueeze(2)
    out, _, _ = _ops.attention(q, k, v, bias, mask, None, None, None, opts, False, need_lse=False, checked=True)
    return out.transpose(1, 2) if nd == 4 else out.squeeze(2)


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
    return _core._thread_list(_local, "modes")


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


# ---------------------------------------------------------------- the pool
# torch's OpenMP workers spin for a while after each torch op; a pool of flashattn's
# own starting work on the same cores then competes with them. So contexts made once
# flashattn.torch is imported (each thread's default context, and Context()) hand
# their parallel work to torch's pool: the binding finds the OpenMP runtime torch
# loaded and runs each job in a parallel region of it, as wide as the context's
# threads (torch.get_num_threads() when the context was made) and never wider than
# torch's count at the call. Results are bitwise the same on either pool.


def _on_torch_pool(c, threads_given):
    """_core._host_pool: puts the new _C.Context c on torch's pool, with torch's thread
    count unless its threads were given. Returns "" or why not (c keeps its own)."""
    why = _C.set_host_pool(c, True)
    if not why and not threads_given:
        c.set(_C.PARAM_THREADS, torch.get_num_threads())
    return why


def set_pool(mode):
    """"host" (the default from import on): contexts made from now on run their parallel
    work on torch's intra-op pool; "own": on threads of their own, as without
    flashattn.torch. The calling thread's default context follows at once; other
    threads' default contexts made before keep their pool (Context.pool sets one
    context's). Raises RuntimeError for "host" when no OpenMP runtime is loaded."""
    if mode not in ("own", "host"):
        raise ValueError(f"pool must be 'own' or 'host', got {mode!r}")
    why = _C.omp_runtime()["why"] if mode == "host" else ""
    if why:
        raise RuntimeError(f"flashattn: no host pool: {why}")
    _core._host_pool = _on_torch_pool if mode == "host" else None
    c = getattr(_core._local, "default", None)
    if c is not None:
        if mode == "host":
            _on_torch_pool(c, False)
        else:
            _C.set_host_pool(c, False)


def pool_info():
    """{"pool": "host" or "own" (what contexts made now get), "runtime": the OpenMP
    runtime's file, or why none is usable}."""
    rt = _C.omp_runtime()
    return {"pool": "host" if _core._host_pool is not None else "own", "runtime": rt["path"] or rt["why"]}


if os.environ.get("FLASHATTN_TORCH_POOL", "host") != "own":
    if _C.omp_runtime()["path"]:
        set_pool("host")
    else:  # the library keeps its own threads
        _verbose("pool:own,why:" + _C.omp_runtime()["why"])
