"""flashattn._core: contexts, and the argument rules shared by every front end.

Owns:
  - Context, the Python face of one fa_context (threads, algorithm);
  - the per-thread default context and the `with ctx:` stack that makes a Context
    current for this thread only (a context serves one thread at a time: the C
    library answers FA_ERR_BUSY otherwise, so nothing here shares one implicitly);
  - which pool new contexts run on: their own threads, or the host's when
    flashattn.torch has set _host_pool (torch's intra-op OpenMP pool);
  - Options, the one options object of a call: the C library's OPTION fields
    (include/flashattn.h, FA_FORWARD_FIELDS), read from the library's description
    of itself (fa_args_field), so a field added there is a member here;
  - the translation of flash-attn 2.x's arguments (softmax_scale, causal,
    window_size, ...) into the binding's (scale, causal code, window) so that
    the NumPy path and the torch custom ops read them the same way.
torch is never imported here.
"""

import collections
import sys
import threading

from . import _C

CAUSAL_NONE, CAUSAL_BOTTOM_RIGHT, CAUSAL_TOP_LEFT = 0, 1, 2

# fa_forward_args' fields as the library describes them: dicts of name, key, ctype,
# doc, offset, size, type, role and default, in the struct's order.
FORWARD_FIELDS = tuple(_C.fields(_C.ARGS_FORWARD))
_INTEGER_TYPES = (_C.FIELD_I32, _C.FIELD_I64, _C.FIELD_U32, _C.FIELD_U64)


def _default(field):
    return int(field["default"]) if field["type"] in _INTEGER_TYPES else float(field["default"])


OPTION_FIELDS = tuple(f for f in FORWARD_FIELDS if f["role"] == _C.ROLE_OPTION)
# A tuple, so that the binding reads it by position (in the table's order) in a few
# nanoseconds per member; built from the table, so a new option needs no line here.
Options = collections.namedtuple("Options", [f["key"] for f in OPTION_FIELDS],
                                 defaults=[_default(f) for f in OPTION_FIELDS])
Options.__doc__ = ("The scalar options of one flashattn call (fa_forward_args' OPTION fields, in its order; "
                   "the values are the C library's: causal a code, -1 an unbounded window):\n" +
                   "\n".join(f"  {f['key']} ({f['ctype']}, default {_default(f)}): {f['doc']}"
                             for f in OPTION_FIELDS))
DEFAULT_OPTIONS = Options()
_ALGOS = {"auto": 0, "flash": 1, "standard": 2, "reference": 3}
_POOLS = ("own", "host", "host-failed")  # FA_PARAM_LAST_POOL's values

# None, or what puts a new context on the host's pool: a function of the _C.Context
# and whether its threads were given, returning "" or why it could not (then the
# context keeps its own threads). flashattn.torch sets it (flashattn.torch.set_pool).
_host_pool = None


def _named_param(name, param, modes, doc):
    """A Context property over the context parameter param, whose codes are modes'
    values and whose Python values are its keys."""
    names = {v: k for k, v in modes.items()}

    def get(self):
        return names[self._c.get(param)]

    def set(self, mode):
        if mode not in modes:
            raise ValueError(f"{name} must be one of {sorted(modes)}, got {mode!r}")
        self._c.set(param, modes[mode])

    return property(get, set, doc=doc)


def _new_context(threads, algo):
    """A _C.Context, and the pool it runs on ("own" or "host")."""
    c = _C.Context(threads, algo)
    if _host_pool is not None and not _host_pool(c, threads != 0):
        return c, "host"
    return c, "own"


class Context:
    """A flashattn context: worker threads and the algorithm every call on it runs.

    threads: worker threads including the caller, 0 = one per online CPU (on torch's
      pool: torch.get_num_threads()).
    algo: "auto" (flash), "flash", "standard" or "reference" (fp64 loops, the oracle).

    Its parallel work runs on threads of its own, or, once flashattn.torch is imported,
    on torch's intra-op pool (see `pool`).

    A Context serves one thread at a time. `with ctx:` makes it the current context
    of the calling thread (for flash_attn_func and the torch ops too); using one
    from two threads at once raises RuntimeError (the library's FA_ERR_BUSY).
    """

    def __init__(self, threads=0, algo="auto"):
        if isinstance(algo, str):
            if algo not in _ALGOS:
                raise ValueError(f"algo must be one of {sorted(_ALGOS)}, got {algo!r}")
            algo = _ALGOS[algo]
        self._c, self._pool = _new_context(int(threads), int(algo))

    @property
    def threads(self):
        return self._c.get(_C.PARAM_THREADS)

    @threads.setter
    def threads(self, n):
        self._c.set(_C.PARAM_THREADS, int(n))

    @property
    def algo(self):
        return _C.algo_name(self._c.get(_C.PARAM_ALGO))

    @property
    def pool(self):
        """Where its parallel work runs: "own" (threads of its own) or "host" (the
        loaded OpenMP runtime's, torch's intra-op pool; flashattn.torch.set_pool).
        Results are bitwise the same either way."""
        return self._pool

    @pool.setter
    def pool(self, mode):
        if mode not in ("own", "host"):
            raise ValueError(f"pool must be 'own' or 'host', got {mode!r}")
        why = _C.set_host_pool(self._c, mode == "host")
        if why:
            raise RuntimeError(f"flashattn: no host pool: {why}")
        self._pool = mode

    _KV_PACK = {"auto": 0, "never": 1, "always": 2}
    kv_pack = _named_param(
        "kv_pack", _C.PARAM_KV_PACK, _KV_PACK,
        """Whether the flash forward copies each (sequence, kv head)'s K and V once
        into dense rows shared by its query blocks: "auto" (where converting,
        gathering or pairing them per tile would cost more; the default), "never"
        or "always". Results are bitwise the same either way.""")

    _QUANT_MATMUL = {"exact": 0, "i8": 1, "i8x2": 2}
    quant_matmul = _named_param(
        "quant_matmul", _C.PARAM_QUANT_MATMUL, _QUANT_MATMUL,
        """The forward's products on int8 codes for every call of this context
        (FA_PARAM_QUANT_MATMUL, docs/semantics.md, section 11): "exact" (the default,
        or $FLASHATTN_QUANT_MATMUL), "i8" or "i8x2". A call's quant_matmul keyword
        overrides it; this is the switch for routes without the keyword (torch's SDPA).
        The backward refuses calls whose mode is not "exact".""")

    @property
    def isa(self):
        """The micro-kernel path: "ref", "avx2", "avx2vnni", "avx512", "avx512bf16", "amx", "amx-model" or "neon"."""
        return self._c.isa

    def last(self):
        """What the last successful call ran: algorithm, threads and pool ("own",
        "host", or "host-failed" when the host's parallel-for failed and the calling
        thread finished its work), extra bytes allocated,
        for a flash backward its passes (1 fused; 2 when the (sequence, kv head)
        walks were too few for the threads; 0 otherwise), and for a flash forward the
        (sequence, kv head) units whose K/V it packed (see kv_pack) and the thread time
        that took, in microseconds, and the tiles it used (0 for other algorithms; see
        flashattn.tune)."""
        return {
            "algo": _C.algo_name(self._c.get(_C.PARAM_LAST_ALGO)),
            "threads": self._c.get(_C.PARAM_LAST_THREADS),
            "extra_bytes": self._c.get(_C.PARAM_LAST_EXTRA_BYTES),
            "backward_passes": self._c.get(_C.PARAM_LAST_BACKWARD_PASSES),
            "kv_packed": self._c.get(_C.PARAM_LAST_KV_PACKED),
            "kv_pack_us": self._c.get(_C.PARAM_LAST_KV_PACK_US),
            "tile_q": self._c.get(_C.PARAM_LAST_TILE_Q),
            "tile_kv": self._c.get(_C.PARAM_LAST_TILE_KV),
            "pool": _POOLS[self._c.get(_C.PARAM_LAST_POOL)],
        }

    def close(self):
        self._c.close()

    def __enter__(self):
        _stack().append(self)
        return self

    def __exit__(self, *exc):
        stack = _stack()
        if stack and stack[-1] is self:
            stack.pop()
        return False

    def __repr__(self):
        if self._c.closed:
            return "flashattn.Context(closed)"
        return f"flashattn.Context(threads={self.threads}, algo={self.algo!r}, isa={self.isa!r})"


_local = threading.local()


def _thread_list(local, name):
    """The list `name` of the calling thread on the threading.local `local`, created
    empty on first use."""
    s = getattr(local, name, None)
    if s is None:
        s = []
        setattr(local, name, s)
    return s


def _stack():
    return _thread_list(_local, "stack")


def current_context():
    """The calling thread's context: the innermost `with ctx:`, else this thread's
    own default (created on first use, one worker per online CPU)."""
    s = getattr(_local, "stack", None)
    if s:
        return s[-1]._c
    c = getattr(_local, "default", None)
    if c is None:
        c = _local.default = _new_context(0, 0)[0]
    return c


def is_torch(x):
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def scale_of(softmax_scale):
    # The C library reads scale 0 as "the default 1/sqrt(D)": a caller's explicit 0
    # would silently mean something else, so it is refused.
    if softmax_scale is None:
        return 0.0
    s = float(softmax_scale)
    if s == 0.0:
        raise ValueError("softmax_scale = 0 is not supported (flashattn reads 0 as the default 1/sqrt(headdim))")
    return s


def causal_of(causal):
    """flash-attn's causal=True is bottom-right; "top-left" is PyTorch's is_causal."""
    if causal is False or causal is None:
        return CAUSAL_NONE
    if causal is True or causal == "bottom-right":
        return CAUSAL_BOTTOM_RIGHT
    if causal == "top-left":
        return CAUSAL_TOP_LEFT
    raise ValueError(f"causal must be True, False, 'bottom-right' or 'top-left', got {causal!r}")


def window_of(window_size):
    try:
        left, right = window_size
        left, right = int(left), int(right)
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"window_size sides must be -1 (unbounded) or >= 0, got {window_size!r}")
    return left, right
