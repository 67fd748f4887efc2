#!/usr/bin/env python3
"""torch_sdpa.py: flashattn against PyTorch's CPU scaled_dot_product_attention.

Owns the peer benchmark: one process, the same tensors (BNSD torch tensors that
flashattn reads zero-copy through strides), the same thread count on both
sides, calls interleaved (torch, flashattn, torch, flashattn, ...) and medians
reported. It loads build/libflashattn.so with ctypes and builds the argument
structs from the library's description of itself (fa_args_field), so a field
added to the header needs no line here; a tiny C program compiled at start-up
checks that those structs have the header's sizes and offsets, so a mismatch of
library and header fails loudly instead of passing garbage. Run it through bench/peers/run.sh, which
sets up the venv with torch.
"""

import argparse
import ctypes as C
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# ----------------------------------------------------------------- the C ABI

FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16 = 0, 1, 2
FA_CAUSAL_NONE, FA_CAUSAL_BOTTOM_RIGHT = 0, 1
FA_PARAM_THREADS = 1
FA_PARAM_LAST_THREADS = 104
FA_PARAM_LAST_POOL = 110
FA_PARAM_BF16_DOT_ACTIVE = 105
FA_PROBE_FMA_PEAK, FA_PROBE_BF16_PEAK, FA_PROBE_TILE_PEAK = 1, 2, 4


class FaTensor(C.Structure):
    _fields_ = [
        ("data", C.c_void_p),
        ("dtype", C.c_int),  # an enum: int-sized on every ABI the library targets
        ("shape", C.c_int64 * 4),
        ("stride", C.c_int64 * 4),
    ]


class FaField(C.Structure):
    """fa_field: the library's description of one field of its argument structs."""

    _fields_ = [
        ("struct_size", C.c_size_t),
        ("name", C.c_char_p),
        ("key", C.c_char_p),
        ("ctype", C.c_char_p),
        ("doc", C.c_char_p),
        ("offset", C.c_size_t),
        ("size", C.c_size_t),
        ("type", C.c_int),
        ("role", C.c_int),
        ("default_value", C.c_double),
    ]


FA_ARGS_FORWARD, FA_ARGS_BACKWARD, FA_ARGS_KV_CACHE = 0, 1, 2
FA_ERR_OUT_OF_RANGE = 15
# fa_field_type -> the ctypes type of a member
FIELD_CTYPES = {0: C.c_size_t, 1: FaTensor, 2: C.c_float, 3: C.c_int32, 4: C.c_int64, 5: C.c_uint32,
                6: C.c_uint64, 7: C.c_void_p}


def mirror(so, kind, cname):
    """The ctypes struct of one of the library's argument structs, built from the
    library's description of itself (fa_args_field: the header's field table), so a
    field the library gains needs no line here. Pointers are c_void_p."""
    so.fa_args_field.argtypes = [C.c_int, C.c_int, C.POINTER(FaField)]
    so.fa_args_field.restype = C.c_int
    rows = []
    while True:
        f = FaField(struct_size=C.sizeof(FaField))
        st = so.fa_args_field(kind, len(rows), C.byref(f))
        if st == FA_ERR_OUT_OF_RANGE:
            break
        if st != 0:
            sys.exit(f"torch_sdpa: fa_args_field({cname}, {len(rows)}) failed with status {st}")
        rows.append((f.name.decode(), f.type, f.offset, f.default_value))
    cls = type(cname, (C.Structure,), {"_fields_": [(name, FIELD_CTYPES[t]) for name, t, _, _ in rows]})
    # the struct_size row's default is the library's sizeof; every offset is the library's
    bad = [f"{name}: library {off}, ctypes {getattr(cls, name).offset}" for name, _, off, _ in rows
           if getattr(cls, name).offset != off]
    if C.sizeof(cls) != int(rows[0][3]):
        bad.append(f"sizeof: library {int(rows[0][3])}, ctypes {C.sizeof(cls)}")
    if bad:
        sys.exit(f"torch_sdpa: ctypes cannot lay out {cname} as the library does:\n  " + "\n  ".join(bad))
    return cls


ABI_STRUCTS = {"fa_tensor": FaTensor}


def load_structs(so):
    """FaForwardArgs, FaKvCache and FaBackwardArgs as the library describes them."""
    global FaForwardArgs, FaKvCache, FaBackwardArgs
    FaForwardArgs = mirror(so, FA_ARGS_FORWARD, "fa_forward_args")
    FaKvCache = mirror(so, FA_ARGS_KV_CACHE, "fa_kv_cache")
    FaBackwardArgs = mirror(so, FA_ARGS_BACKWARD, "fa_backward_args")
    ABI_STRUCTS.update({"fa_forward_args": FaForwardArgs, "fa_kv_cache": FaKvCache,
                        "fa_backward_args": FaBackwardArgs})


def check_abi(include_dir):
    """Compiles a program that prints sizeof and every offsetof of the structs
    above (as the library described them, load_structs) against the header and
    compares them with ctypes; any difference is fatal, because a wrong layout
    would make the library read the wrong fields silently (a library built from
    another header than include/'s)."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "flashattn.h"', "int main(void) {"]
    for cname, cls in ABI_STRUCTS.items():
        lines.append(f'    printf("{cname} sizeof %zu\\n", sizeof({cname}));')
        for fname, _ in cls._fields_:
            lines.append(f'    printf("{cname} {fname} %zu\\n", offsetof({cname}, {fname}));')
    lines += ["    return 0;", "}"]
    cc = os.environ.get("CC", "cc")
    with tempfile.TemporaryDirectory(prefix="fa-peers-abi-") as tmp:
        src, exe = os.path.join(tmp, "abi.c"), os.path.join(tmp, "abi")
        with open(src, "w") as f:
            f.write("\n".join(lines) + "\n")
        try:
            subprocess.run([cc, "-std=c11", "-I", include_dir, src, "-o", exe], check=True,
                           capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as e:
            detail = getattr(e, "stderr", "") or str(e)
            sys.exit(f"torch_sdpa: cannot compile the ABI check with {cc!r}: {detail}")
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    want = {}
    for line in out.splitlines():
        cname, fname, value = line.split()
        want[(cname, fname)] = int(value)
    bad = []
    for cname, cls in ABI_STRUCTS.items():
        got = C.sizeof(cls)
        if got != want[(cname, "sizeof")]:
            bad.append(f"sizeof({cname}): C {want[(cname, 'sizeof')]}, ctypes {got}")
        for fname, _ in cls._fields_:
            got = getattr(cls, fname).offset
            if got != want[(cname, fname)]:
                bad.append(f"offsetof({cname}, {fname}): C {want[(cname, fname)]}, ctypes {got}")
    if bad:
        sys.exit("torch_sdpa: the ctypes structs disagree with include/flashattn.h:\n  " + "\n  ".join(bad))
    return {c: want[(c, "sizeof")] for c in ABI_STRUCTS}


# flashattn on torch's OpenMP threads, as the Python package runs it (python/src/binding.cpp,
# "the host's threads"): a parallel-for over torch's libgomp, compiled at start-up, so that
# flashattn's own pool does not take turns on the cores with torch's OpenMP workers, which
# spin for a while after each torch op (measured here: a flashattn call right after a torch
# call took ~20% longer on its own pool than one after a pause).
OMP_HOST_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
typedef void (*task_fn)(void *, int, int);
static void (*gomp_parallel)(void (*)(void *), void *, unsigned, unsigned);
static int (*thread_num)(void), (*num_threads)(void), (*max_threads)(void);
struct job { task_fn task; void *arg; int nth; };
static void region(void *p)
{
    struct job *j = p;
    for (int i = thread_num(), n = num_threads(); i < j->nth; i += n) j->task(j->arg, i, j->nth);
}
int peer_omp_parallel_for(void *user, int nth, task_fn task, void *arg)
{
    struct job j = {task, arg, nth};
    const int most = max_threads();
    (void)user;
    gomp_parallel(region, &j, (unsigned)(nth < most ? nth : most), 0);
    return 0;
}
int peer_omp_init(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return -1;
    *(void **)&gomp_parallel = dlsym(h, "GOMP_parallel");
    *(void **)&thread_num = dlsym(h, "omp_get_thread_num");
    *(void **)&num_threads = dlsym(h, "omp_get_num_threads");
    *(void **)&max_threads = dlsym(h, "omp_get_max_threads");
    return gomp_parallel && thread_num && num_threads && max_threads ? 0 : -2;
}
"""


def torch_omp_host():
    """The parallel-for over torch's loaded OpenMP runtime (a ctypes function pointer), or
    (None, why)."""
    import torch  # noqa: F401  (loads its libgomp)
    paths = []
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            base = os.path.basename(path)
            if base.startswith(("libgomp", "libiomp5", "libomp")) and path not in paths:
                paths.append(path)
    paths.sort(key=lambda p: "/torch/" not in p)
    if not paths:
        return None, "no OpenMP runtime is loaded"
    tmp = tempfile.mkdtemp(prefix="fa-peers-omp-")
    src, so = os.path.join(tmp, "omp_host.c"), os.path.join(tmp, "omp_host.so")
    with open(src, "w") as f:
        f.write(OMP_HOST_C)
    try:
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", src, "-o", so, "-ldl"], check=True,
                       capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        return None, f"cannot compile the OpenMP parallel-for: {getattr(e, 'stderr', e)}"
    shim = C.CDLL(so)
    shim.peer_omp_init.argtypes = [C.c_char_p]
    if shim.peer_omp_init(paths[0].encode()) != 0:
        return None, f"{paths[0]} lacks GOMP_parallel or omp_get_*"
    return (shim, C.cast(shim.peer_omp_parallel_for, C.c_void_p), paths[0]), None


class Lib:
    """The few library calls the benchmark makes, with their signatures."""

    def __init__(self, path):
        self.so = C.CDLL(path)
        so = self.so
        load_structs(so)
        so.fa_context_create.argtypes = [C.POINTER(C.c_void_p)]
        so.fa_context_create.restype = C.c_int
        so.fa_context_free.argtypes = [C.c_void_p]
        so.fa_context_free.restype = None
        so.fa_context_set.argtypes = [C.c_void_p, C.c_int, C.c_int64]
        so.fa_context_set.restype = C.c_int
        so.fa_context_get.argtypes = [C.c_void_p, C.c_int, C.POINTER(C.c_int64)]
        so.fa_context_get.restype = C.c_int
        so.fa_context_error.argtypes = [C.c_void_p]
        so.fa_context_error.restype = C.c_char_p
        so.fa_context_isa.argtypes = [C.c_void_p]
        so.fa_context_isa.restype = C.c_char_p
        so.fa_status_string.argtypes = [C.c_int]
        so.fa_status_string.restype = C.c_char_p
        so.fa_version_string.argtypes = []
        so.fa_version_string.restype = C.c_char_p
        so.fa_probe.argtypes = [C.c_void_p, C.c_int, C.POINTER(C.c_double)]
        so.fa_probe.restype = C.c_int
        so.fa_forward_args_init.argtypes = [C.POINTER(FaForwardArgs)]
        so.fa_forward_args_init.restype = None
        so.fa_backward_args_init.argtypes = [C.POINTER(FaBackwardArgs)]
        so.fa_backward_args_init.restype = None
        so.fa_kv_cache_init.argtypes = [C.POINTER(FaKvCache)]
        so.fa_kv_cache_init.restype = None
        so.fa_forward.argtypes = [C.c_void_p, C.POINTER(FaForwardArgs)]
        so.fa_forward.restype = C.c_int
        so.fa_backward.argtypes = [C.c_void_p, C.POINTER(FaBackwardArgs)]
        so.fa_backward.restype = C.c_int
        so.fa_context_set_parallel.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p]
        so.fa_context_set_parallel.restype = C.c_int
        ctx = C.c_void_p()
        self.check(so.fa_context_create(C.byref(ctx)), None, "fa_context_create")
        self.ctx = ctx

    def check(self, status, ctx, what):
        if status != 0:
            msg = self.so.fa_status_string(status).decode()
            detail = self.so.fa_context_error(ctx).decode() if ctx else ""
            raise RuntimeError(f"{what}: {msg}: {detail}")

    def set(self, param, value):
        self.check(self.so.fa_context_set(self.ctx, param, value), self.ctx, f"fa_context_set({param})")

    def get(self, param):
        v = C.c_int64()
        self.check(self.so.fa_context_get(self.ctx, param, C.byref(v)), self.ctx, f"fa_context_get({param})")
        return v.value

    def use_host(self, host):
        """Runs the context's parallel work on host (torch_omp_host's), or its own threads (None)."""
        fn = host[1] if host else None
        self.check(self.so.fa_context_set_parallel(self.ctx, fn, None), self.ctx, "fa_context_set_parallel")
        self.host = host

    def probe(self, kind):
        v = C.c_double()
        st = self.so.fa_probe(self.ctx, kind, C.byref(v))
        return v.value if st == 0 else None

    def forward(self, args):
        self.check(self.so.fa_forward(self.ctx, C.byref(args)), self.ctx, "fa_forward")

    def backward(self, args):
        self.check(self.so.fa_backward(self.ctx, C.byref(args)), self.ctx, "fa_backward")


# ------------------------------------------------------------ torch <-> C views

def fa_dtype_of(t):
    import torch
    table = {torch.float32: FA_DTYPE_F32, torch.float16: FA_DTYPE_F16, torch.bfloat16: FA_DTYPE_BF16}
    return table[t.dtype]


def view_bnsd(t):
    """A zero-copy fa_tensor of a torch tensor shaped (B, N, S, D): the library's
    logical order is (batch, seq, head, dim), so heads and seq swap places in
    shape and strides (strides in elements, as torch gives them)."""
    assert t.dim() == 4
    b, n, s, d = t.shape
    sb, sn, ss, sd = t.stride()
    ft = FaTensor()
    ft.data = t.data_ptr()
    ft.dtype = fa_dtype_of(t)
    ft.shape[:] = [b, s, n, d]
    ft.stride[:] = [sb, ss, sn, sd]
    return ft


def view_lse(t):
    """lse is (B, Hq, Sq, 1) f32, row-major."""
    b, h, s = t.shape
    ft = FaTensor()
    ft.data = t.data_ptr()
    ft.dtype = FA_DTYPE_F32
    ft.shape[:] = [b, h, s, 1]
    ft.stride[:] = [h * s, s, 1, 1]
    return ft


# ----------------------------------------------------------------- the cases

CASES = {
    # name: (kind, dtype name, causal)
    "fwd_f32": ("fwd", "f32", False),
    "fwd_bf16": ("fwd", "bf16", False),
    "causal_bf16": ("fwd", "bf16", True),
    "causal_f32": ("fwd", "f32", True),
    "fwd_f16": ("fwd", "f16", False),
    "bwd_f32": ("bwd", "f32", False),
    "bwd_bf16": ("bwd", "bf16", False),
    "fwdbwd_f32": ("fwdbwd", "f32", False),
    "fwdbwd_bf16": ("fwdbwd", "bf16", False),
    "fwdbwd_causal_bf16": ("fwdbwd", "bf16", True),
    "decode_f16": ("decode", "f16", False),
    "decode_bf16": ("decode", "bf16", False),
    # chunked prefill: N tokens packed as N / --chunk sequences (cu_seqlens), each
    # attending to itself; torch gets the same chunks as one dense batch (see Case)
    "varlen_bf16": ("varlen", "bf16", False),
    "varlen_causal_bf16": ("varlen", "bf16", True),
}
DEFAULT_CASES = list(CASES)
TOLERANCE = {"f32": 1e-4, "bf16": 2e-2, "f16": 2e-2}


def torch_dtype(name):
    import torch
    return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[name]


def rel_err(got, want):
    """max |got - want| / max |want|: scaled to the output, since attention
    outputs shrink like 1/sqrt(N) and an absolute bound would mean nothing."""
    got, want = got.float(), want.float()
    scale = want.abs().max().item()
    return (got - want).abs().max().item() / (scale if scale > 0 else 1.0)


def flops_forward(case, n, sq, b, h, d, dv):
    """STYLE rule: 2*(D+Dv) per kept (i, j) pair; a causal row is credited
    only with the pairs it keeps (bottom-right, Sq == Sk: i + 1 keys)."""
    if CASES[case][2]:
        pairs = n * (n + 1) // 2 if sq == n else sum(min(n, i + n - sq + 1) for i in range(sq))
    else:
        pairs = sq * n
    return 2.0 * (d + dv) * pairs * b * h


class Case:
    """One (case, N): the tensors both libraries see and the two timed calls."""

    def __init__(self, lib, name, n, opts):
        import torch
        import torch.nn.functional as F
        self.torch, self.F = torch, F
        self.lib, self.name, self.n, self.opts = lib, name, n, opts
        self.kind, self.dtname, self.causal = CASES[name]
        B, H, D = opts.batch, opts.heads, opts.dim
        if self.kind == "varlen":
            self._init_varlen(n, opts)
            return
        dt = torch_dtype(self.dtname)
        g = torch.Generator().manual_seed(1234 + n)
        sq = 1 if self.kind == "decode" else n
        self.sq = sq

        def rnd(s):
            return torch.randn(B, H, s, D, generator=g, dtype=torch.float32).to(dt)

        self.q, self.k, self.v = rnd(sq), rnd(n), rnd(n)
        self.args = FaForwardArgs()
        lib.so.fa_forward_args_init(C.byref(self.args))
        self.args.causal = FA_CAUSAL_BOTTOM_RIGHT if self.causal else FA_CAUSAL_NONE
        fwd_flops = flops_forward(name, n, sq, B, H, D, D)
        self.flops = {"fwd": fwd_flops, "decode": fwd_flops, "bwd": 2.5 * fwd_flops,
                      "fwdbwd": 3.5 * fwd_flops}[self.kind]

        if self.kind == "decode":
            self._setup_decode()
        else:
            self.o = torch.empty_like(self.q)
            self.args.q, self.args.k, self.args.v = view_bnsd(self.q), view_bnsd(self.k), view_bnsd(self.v)
            self.args.o = view_bnsd(self.o)
            if self.kind in ("bwd", "fwdbwd"):
                self._setup_backward()

    def _init_varlen(self, n, opts):
        """Chunked prefill: n tokens of each of the --batch sequences cut into chunks
        of --chunk tokens, every chunk its own sequence (Sq = Sk = chunk). flashattn
        takes them packed, (1, total, H, D) with cu_seqlens; torch has no varlen
        form on the CPU, and the strongest thing it can do with equal chunks is one
        dense batch (chunks, H, chunk, D), which is what it gets: one call, no mask
        (a block-diagonal mask over the packed tokens would send it to the math
        kernel, and a call per chunk would pay its per-call cost each time). The
        values are the same on both sides, each in its own natural layout."""
        torch = self.torch
        H, D, L = opts.heads, opts.dim, opts.chunk
        if n % L:
            raise RuntimeError(f"N={n} is not a multiple of --chunk {L}")
        chunks = opts.batch * n // L
        dt = torch_dtype(self.dtname)
        g = torch.Generator().manual_seed(1234 + n)
        self.sq = L
        self.q, self.k, self.v = (torch.randn(chunks, H, L, D, generator=g, dtype=torch.float32).to(dt)
                                  for _ in range(3))
        # flashattn's packed copies: token c * L + s of head h = chunk c's row s
        self.fq, self.fk, self.fv = (t.transpose(1, 2).reshape(1, chunks * L, H, D).transpose(1, 2).contiguous()
                                     for t in (self.q, self.k, self.v))
        self.o = torch.empty_like(self.fq)
        self.cu = (C.c_int32 * (chunks + 1))(*[c * L for c in range(chunks + 1)])
        self.args = FaForwardArgs()
        self.lib.so.fa_forward_args_init(C.byref(self.args))
        self.args.causal = FA_CAUSAL_BOTTOM_RIGHT if self.causal else FA_CAUSAL_NONE
        self.args.q, self.args.k, self.args.v = view_bnsd(self.fq), view_bnsd(self.fk), view_bnsd(self.fv)
        self.args.o = view_bnsd(self.o)
        self.args.cu_seqlens_q = self.args.cu_seqlens_k = C.cast(self.cu, C.c_void_p)
        self.args.num_seqs = chunks
        self.flops = flops_forward(self.name, L, L, chunks, H, D, D)

    def _varlen_out(self):
        """flashattn's packed o as torch's (chunks, H, chunk, D)."""
        chunks, H, L, D = self.q.shape
        return self.o.transpose(1, 2).reshape(chunks, L, H, D).transpose(1, 2)

    def _setup_decode(self):
        torch = self.torch
        # The cache is the very k/v torch attends to; flashattn's q is f32 for an
        # f16 cache (the usual "f32 activations, f16 cache" decode) and bf16 for a
        # bf16 cache. Torch needs q, k, v of one dtype, so its q is in the cache's.
        self.fa_q = self.q.float() if self.dtname == "f16" else self.q
        self.o = torch.empty(self.fa_q.shape, dtype=self.fa_q.dtype)
        self.seqlens = (C.c_int32 * self.opts.batch)(*([self.n] * self.opts.batch))
        self.cache = FaKvCache()
        self.lib.so.fa_kv_cache_init(C.byref(self.cache))
        self.cache.k, self.cache.v = view_bnsd(self.k), view_bnsd(self.v)
        self.cache.seqlens = C.cast(self.seqlens, C.c_void_p)
        self.args.q, self.args.o = view_bnsd(self.fa_q), view_bnsd(self.o)
        self.args.kv_cache = C.cast(C.pointer(self.cache), C.c_void_p)

    def _setup_backward(self):
        torch = self.torch
        g = torch.Generator().manual_seed(99 + self.n)
        self.dout = torch.randn(self.q.shape, generator=g).to(self.q.dtype)
        self.lse = torch.empty(self.q.shape[0], self.q.shape[1], self.q.shape[2], dtype=torch.float32)
        self.dq, self.dk, self.dv = (torch.empty_like(t) for t in (self.q, self.k, self.v))
        self.args.lse = view_lse(self.lse)
        self.bargs = FaBackwardArgs()
        self.lib.so.fa_backward_args_init(C.byref(self.bargs))
        self.bargs.fwd = C.cast(C.pointer(self.args), C.c_void_p)
        self.bargs.do_ = view_bnsd(self.dout)
        self.bargs.dq, self.bargs.dk, self.bargs.dv = view_bnsd(self.dq), view_bnsd(self.dk), view_bnsd(self.dv)
        self.tq, self.tk, self.tv = (t.detach().clone().requires_grad_(True) for t in (self.q, self.k, self.v))

    # ---- torch's side
    def torch_sdpa(self, q, k, v):
        return self.F.scaled_dot_product_attention(q, k, v, is_causal=self.causal and self.kind != "decode")

    def torch_forward_graph(self):
        for t in (self.tq, self.tk, self.tv):
            t.grad = None
        return self.torch_sdpa(self.tq, self.tk, self.tv)

    def time_torch(self):
        if self.kind in ("fwd", "decode", "varlen"):
            with self.torch.no_grad():
                t0 = time.perf_counter()
                self.torch_sdpa(self.q, self.k, self.v)
                return time.perf_counter() - t0
        if self.kind == "bwd":
            out = self.torch_forward_graph()  # untimed: only .backward() is measured
            t0 = time.perf_counter()
            out.backward(self.dout)
            return time.perf_counter() - t0
        t0 = time.perf_counter()
        out = self.torch_forward_graph()
        out.backward(self.dout)
        return time.perf_counter() - t0

    # ---- flashattn's side
    def time_fa(self):
        if self.kind in ("fwd", "decode", "varlen"):
            t0 = time.perf_counter()
            self.lib.forward(self.args)
            return time.perf_counter() - t0
        if self.kind == "bwd":
            # fa_backward reads the o and lse of the forward that check() ran;
            # it never writes them, so one forward serves every timed backward.
            t0 = time.perf_counter()
            self.lib.backward(self.bargs)
            return time.perf_counter() - t0
        t0 = time.perf_counter()
        self.lib.forward(self.args)
        self.lib.backward(self.bargs)
        return time.perf_counter() - t0

    def check(self):
        """Runs both sides once (also the warm-up) and compares the results."""
        tol = TOLERANCE[self.dtname]
        errs = {}
        if self.kind in ("fwd", "decode", "varlen"):
            with self.torch.no_grad():
                ref = self.torch_sdpa(self.q, self.k, self.v)
            self.lib.forward(self.args)
            errs["o"] = rel_err(self._varlen_out() if self.kind == "varlen" else self.o, ref)
        else:
            out = self.torch_forward_graph()
            out.backward(self.dout)
            self.lib.forward(self.args)
            self.lib.backward(self.bargs)
            errs["o"] = rel_err(self.o, out.detach())
            errs["dq"] = rel_err(self.dq, self.tq.grad)
            errs["dk"] = rel_err(self.dk, self.tk.grad)
            errs["dv"] = rel_err(self.dv, self.tv.grad)
        worst = max(errs.values())
        if not worst <= tol:  # also catches NaN
            detail = ", ".join(f"{k} {v:.2e}" for k, v in errs.items())
            raise RuntimeError(f"{self.name} N={self.n}: flashattn differs from torch ({detail}; tolerance {tol:g})")
        return worst

    def bytes_needed(self):
        each = self.q.numel() * self.q.element_size()
        kv = self.k.numel() * self.k.element_size()
        if self.kind == "decode":
            return 3 * kv
        # q k v o, do, torch's and flashattn's three grads, torch's saved state
        return 12 * max(each, kv)

    def torch_backend(self):
        """Which SDPA kernel torch picks for these inputs (flash on CPU is the fair peer)."""
        try:
            from torch.nn.attention import SDPBackend
            q = self.tq if self.kind in ("bwd", "fwdbwd") else self.q
            k = self.tk if self.kind in ("bwd", "fwdbwd") else self.k
            v = self.tv if self.kind in ("bwd", "fwdbwd") else self.v
            choice = self.torch._fused_sdp_choice(q, k, v, is_causal=self.causal and self.kind != "decode")
            return SDPBackend(choice).name.lower()
        except Exception:  # private API: absent or changed in some versions
            return "unknown"


# ------------------------------------------------------------------- helpers

def log(msg):
    print(msg, file=sys.stderr, flush=True)


def mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def wait_for_load(limit, max_wait):
    """Waits (up to max_wait s) for the 1-minute load to drop below limit: the
    cores are shared, and timing on a busy machine measures the neighbours."""
    load = os.getloadavg()[0]
    waited = 0
    while load > limit and waited < max_wait:
        log(f"# load {load:.2f} > {limit}: waiting ({waited}/{max_wait} s)")
        time.sleep(10)
        waited += 10
        load = os.getloadavg()[0]
    return load


def amx_report(python):
    """Runs one bf16 SDPA, then one bf16 matmul, under ONEDNN_VERBOSE=1 in a
    child process and reports whether oneDNN dispatched AMX kernels, which
    implementations it ran, and the ISA it saw. The matmul is there because
    torch's CPU flash kernel may not call oneDNN at all; then the matmul shows
    what torch's bf16 GEMMs would run on."""
    code = (
        "import sys, torch, torch.nn.functional as F\n"
        "torch.set_num_threads(1)\n"
        "q = torch.randn(1, 4, 256, 128).bfloat16()\n"
        "F.scaled_dot_product_attention(q, q, q)\n"
        "print('@@matmul', flush=True)\n"
        "a = torch.randn(256, 256).bfloat16()\n"
        "torch.mm(a, a)\n"
    )
    env = dict(os.environ, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1")
    try:
        r = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"amx": None, "line": f"AMX check failed: {e}"}
    text = r.stdout + r.stderr
    sdpa_part, _, mm_part = r.stdout.partition("@@matmul")
    isa = ""
    for line in text.splitlines():
        if "isa:" in line and ("onednn_verbose" in line or "dnnl_verbose" in line):
            isa = line.split("isa:", 1)[-1].strip()
            break

    def impls(part):
        # onednn_verbose,v1,primitive,exec,cpu,<primitive>,<implementation>,...
        out = []
        for line in part.splitlines():
            f = line.split(",")
            if len(f) > 6 and f[0] in ("onednn_verbose", "dnnl_verbose") and "exec" in f:
                i = f.index("exec")
                if i + 3 < len(f):
                    out.append(f"{f[i + 2]}:{f[i + 3]}" if ":" not in f[i + 3] else f[i + 3])
        return sorted(set(out))

    used = "amx" in text.lower()
    si, mi = impls(sdpa_part), impls(mm_part)
    line = (f"oneDNN AMX: {'yes' if used else 'no'}; bf16 SDPA ran "
            f"{', '.join(si) if si else 'no oneDNN primitive'}; bf16 matmul ran "
            f"{', '.join(mi) if mi else 'no oneDNN primitive'}; isa: {isa or 'not printed'}")
    return {"amx": used, "line": line, "isa": isa, "sdpa_impls": si, "matmul_impls": mi}


def parallel_line(torch):
    info = torch.__config__.parallel_info()
    keep = [l.strip() for l in info.splitlines()
            if re.search(r"get_num_threads|parallel backend|OMP_NUM_THREADS|MKL_NUM_THREADS", l)]
    return "; ".join(keep)


def parse_seqs(text):
    return [int(x) for x in text.split(",") if x.strip()]


# ---------------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description="flashattn vs torch CPU SDPA, interleaved in one process")
    p.add_argument("--seqs", type=parse_seqs, default=None,
                   help="sequence lengths N (Sq = Sk); default 512,1024,2048,4096,8192")
    p.add_argument("--decode-seqs", type=parse_seqs, default=None,
                   help="KV cache lengths for the decode cases; default: the --seqs")
    p.add_argument("--quick", action="store_true", help="N = 512,1024 (and decode 512,1024), 3 runs")
    p.add_argument("--cases", default=",".join(DEFAULT_CASES),
                   help="comma-separated, from: " + ",".join(CASES))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=None, help="timed runs per side (default 5, --quick 3)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--chunk", type=int, default=256,
                   help="varlen cases: tokens per chunk (each chunk one sequence of the packed call)")
    p.add_argument("--max-call-s", type=float, default=20.0,
                   help="skip an N whose calls are predicted (from the previous N) to exceed this")
    p.add_argument("--max-load", type=float, default=2.5, help="wait while the 1-min load is above this")
    p.add_argument("--load-wait", type=int, default=120, help="longest wait for the load, seconds")
    p.add_argument("--json", action="store_true", help="one JSON object per line on stdout, no table")
    p.add_argument("--plot", metavar="FILE.png", help="latency vs N per case, both libraries")
    p.add_argument("--lib", default=os.path.join(REPO, "build", "libflashattn.so"))
    p.add_argument("--no-amx-check", action="store_true")
    p.add_argument("--fa-pool", choices=("torch", "own"), default="torch",
                   help="flashattn's threads: torch's OpenMP pool, as the Python package runs it "
                        "(default), or the library's own pool")
    opts = p.parse_args()

    seqs = opts.seqs or ([512, 1024] if opts.quick else [512, 1024, 2048, 4096, 8192])
    dseqs = opts.decode_seqs or seqs
    runs = opts.runs or (3 if opts.quick else 5)
    cases = [c.strip() for c in opts.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES:
            p.error(f"unknown case {c!r}; known: {', '.join(CASES)}")

    import torch
    torch.set_num_threads(opts.threads)
    lib = Lib(opts.lib)
    sizes = check_abi(os.path.join(REPO, "include"))
    lib.set(FA_PARAM_THREADS, opts.threads)
    fa_pool = "own"
    if opts.fa_pool == "torch":
        host, why = torch_omp_host()
        if host is None:
            sys.exit(f"torch_sdpa: --fa-pool torch: {why} (--fa-pool own runs the library's threads)")
        lib.use_host(host)
        fa_pool = f"torch's OpenMP ({host[2]})"

    meta = {
        "kind": "meta",
        "torch": torch.__version__,
        "torch_cuda_build": torch.version.cuda,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_parallel": parallel_line(torch),
        "flashattn": lib.so.fa_version_string().decode(),
        "isa": lib.so.fa_context_isa(lib.ctx).decode(),
        "threads": opts.threads,
        "fa_pool": fa_pool,
        "runs": runs,
        "B": opts.batch, "H": opts.heads, "D": opts.dim,
        "abi_sizes": sizes,
    }
    if not opts.no_amx_check:
        meta["amx"] = amx_report(sys.executable)
    log("# probing flashattn's fp32 FMA peak")
    meta["fma_peak_gflops"] = lib.probe(FA_PROBE_FMA_PEAK)
    meta["bf16_peak_gflops"] = lib.probe(FA_PROBE_BF16_PEAK)
    meta["tile_peak_gflops"] = lib.probe(FA_PROBE_TILE_PEAK)  # None where the path has no tile unit
    meta["load_start"] = wait_for_load(opts.max_load, opts.load_wait)

    if opts.json:
        print(json.dumps(meta), flush=True)
    else:
        print(f"# torch {meta['torch']} (CUDA build {meta['torch_cuda_build']}, CPU capability "
              f"{meta['torch_cpu_capability']}), flashattn {meta['flashattn']} isa {meta['isa']}")
        print(f"# torch threads: {meta['torch_parallel']}")
        print(f"# flashattn threads: {fa_pool}")
        if "amx" in meta:
            print(f"# {meta['amx']['line']}")
        fp = meta["fma_peak_gflops"]
        bp = meta["bf16_peak_gflops"]
        print(f"# flashattn fp32 FMA peak {fp:.1f} GFLOP/s on {opts.threads} threads (fa_probe)"
              + (f"; bf16 dot peak {bp:.1f}" if bp else "")
              + (f"; bf16 tile peak {meta['tile_peak_gflops']:.1f}" if meta["tile_peak_gflops"] else "")
              if fp else "# FMA peak probe failed")
        print(f"# B={opts.batch} H={opts.heads} D={opts.dim}, threads {opts.threads} both sides, "
              f"{runs} interleaved runs, medians; load {meta['load_start']:.2f} at start")
        print(f"# ABI: sizeof fa_tensor {sizes['fa_tensor']}, fa_forward_args {sizes['fa_forward_args']}, "
              f"fa_backward_args {sizes['fa_backward_args']}, fa_kv_cache {sizes['fa_kv_cache']} (ctypes matches)")
        hdr = f"{'case':<12} {'N':>6} {'torch ms':>10} {'fa ms':>10} {'torch/fa':>8} " \
              f"{'torch GF/s':>10} {'fa GF/s':>9} {'fa %pk':>7} {'spread t/fa':>11} {'err':>8}  torch kernel"
        print(hdr)
        print("-" * len(hdr))

    rows = []
    for name in cases:
        kind = CASES[name][0]
        prev = None  # (N, per-call seconds) of the last N that ran, for the time guard
        for n in (dseqs if kind == "decode" else seqs):
            row = {"kind": "row", "case": name, "N": n, "dtype": CASES[name][1],
                   "causal": CASES[name][2], "threads": opts.threads, "runs": runs}
            if prev:
                power = 1 if kind in ("decode", "varlen") else 2
                est = prev[1] * (n / prev[0]) ** power
                if est > opts.max_call_s:
                    row["skipped"] = f"predicted {est:.3g} s per call > --max-call-s {opts.max_call_s:g}"
            try:
                case = Case(lib, name, n, opts) if "skipped" not in row else None
            except (RuntimeError, MemoryError) as e:
                row["skipped"] = f"setup failed: {e}"
                case = None
            if case is not None:
                avail = mem_available()
                if avail is not None and case.bytes_needed() > 0.6 * avail:
                    row["skipped"] = f"needs ~{case.bytes_needed() >> 20} MiB of {avail >> 20} MiB available"
                    case = None
            if case is None:
                rows.append(row)
                emit(row, opts)
                continue
            log(f"# {name} N={n}: check + warm-up")
            t0 = time.perf_counter()
            try:
                row["err"] = case.check()
            except RuntimeError as e:
                # A wrong result is not timed; the run goes on and exits non-zero.
                row["error"] = str(e)
                rows.append(row)
                emit(row, opts)
                continue
            row["torch_kernel"] = case.torch_backend()
            warm = time.perf_counter() - t0
            row["load"] = os.getloadavg()[0]
            t_torch, t_fa = [], []
            for r in range(runs):
                t_torch.append(case.time_torch())
                t_fa.append(case.time_fa())
                if warm > 2:
                    log(f"#   run {r + 1}/{runs}: torch {t_torch[-1] * 1e3:.1f} ms, flashattn {t_fa[-1] * 1e3:.1f} ms")
            mt, mf = statistics.median(t_torch), statistics.median(t_fa)
            row.update({
                "torch_ms": mt * 1e3, "fa_ms": mf * 1e3, "ratio": mt / mf,
                "torch_ms_all": [x * 1e3 for x in t_torch], "fa_ms_all": [x * 1e3 for x in t_fa],
                "flops": case.flops,
                "torch_gflops": case.flops / mt / 1e9, "fa_gflops": case.flops / mf / 1e9,
                "fa_threads": lib.get(FA_PARAM_LAST_THREADS),
                "fa_pool": ("own", "host", "host-failed")[lib.get(FA_PARAM_LAST_POOL)],
                "bf16_dot": bool(lib.get(FA_PARAM_BF16_DOT_ACTIVE)) if CASES[name][1] == "bf16" else False,
            })
            peak = meta["fma_peak_gflops"]
            row["fa_pct_fma_peak"] = 100 * row["fa_gflops"] / peak if peak else None
            row["torch_pct_fma_peak"] = 100 * row["torch_gflops"] / peak if peak else None
            # the peak of the path that ran: bf16 pairs multiply on the tile unit where the path
            # has one (amx; the CLI bench's rule, tools/measure.c), else at the bf16 dot peak
            row["peak_kind"] = ("bf16_tile" if meta["tile_peak_gflops"] else "bf16_dot") \
                if row["bf16_dot"] and (meta["tile_peak_gflops"] or meta["bf16_peak_gflops"]) else "fp32_fma"
            kpeak = {"bf16_tile": meta["tile_peak_gflops"], "bf16_dot": meta["bf16_peak_gflops"]}.get(row["peak_kind"], peak)
            row["fa_pct_peak"] = 100 * row["fa_gflops"] / kpeak if kpeak else None
            prev = (n, max(mt, mf) if kind != "bwd" else max(mt, mf) * 1.5)
            rows.append(row)
            emit(row, opts)
            del case

    load_end = os.getloadavg()[0]
    if opts.json:
        print(json.dumps({"kind": "end", "load_end": load_end}), flush=True)
    else:
        print(f"# load {load_end:.2f} at the end; torch/fa > 1 means flashattn is faster")
    if opts.plot:
        plot(rows, opts.plot, meta)
    failed = [r for r in rows if "error" in r]
    if failed:
        sys.exit(f"torch_sdpa: {len(failed)} case(s) did not match torch: " + "; ".join(r["error"] for r in failed))


def emit(row, opts):
    if opts.json:
        print(json.dumps(row), flush=True)
        return
    if "error" in row:
        print(f"{row['case']:<12} {row['N']:>6}  MISMATCH: {row['error']}", flush=True)
        return
    if "skipped" in row:
        print(f"{row['case']:<12} {row['N']:>6}  skipped: {row['skipped']}", flush=True)
        return
    pct = f"{row['fa_pct_peak']:.0f}%" if row["fa_pct_peak"] is not None else "-"
    print(f"{row['case']:<12} {row['N']:>6} {row['torch_ms']:>10.2f} {row['fa_ms']:>10.2f} "
          f"{row['ratio']:>8.2f} {row['torch_gflops']:>10.1f} {row['fa_gflops']:>9.1f} {pct:>7} "
          f"{spread(row['torch_ms_all']) + '/' + spread(row['fa_ms_all']):>11} "
          f"{row['err']:>8.1e}  {row['torch_kernel']}", flush=True)


def spread(times):
    """max / min of one side's runs: 1.0 is a quiet machine; well above it, the
    neighbours were busy during part of the runs."""
    return f"{max(times) / min(times):.1f}"


def plot(rows, path, meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    done = [r for r in rows if "torch_ms" in r]
    names = [c for c in CASES if any(r["case"] == c for r in done)]
    if not names:
        log("# nothing to plot")
        return
    cols = min(3, len(names))
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.6 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        rs = sorted((r for r in done if r["case"] == name), key=lambda r: r["N"])
        xs = [r["N"] for r in rs]
        ax.plot(xs, [r["torch_ms"] for r in rs], "o-", label=f"torch {meta['torch']}")
        ax.plot(xs, [r["fa_ms"] for r in rs], "s-", label="flashattn")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(name)
        ax.set_xlabel("KV cache length N" if CASES[name][0] == "decode" else "N = Sq = Sk")
        ax.set_ylabel("median ms per call")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(f"flashattn vs torch SDPA, CPU, B={meta['B']} H={meta['H']} D={meta['D']}, "
                 f"{meta['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"# plot written to {path}")


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:
        sys.exit(f"torch_sdpa: {e}")
