#!/usr/bin/env python3
"""bench_torch.py: the Python package against PyTorch's own CPU SDPA, in one run.

Owns the figures of issue 12, section 5. Every case times its variants in turns
(A B A B ...; the same tensors, the same thread count on both sides) and reports
medians; progress goes to stderr, the table to stdout.

  overhead   B=1, H=1, S=1, D=64 f32: the C call alone (flashattn._C.time_forward_c,
             a raw entry of the extension that builds the arguments once and loops
             fa_forward in C, no Python in the loop), the binding (_C.forward on
             NumPy arrays), flash_attn_func on NumPy and on torch, flashattn.torch's
             SDPA, torch's SDPA
  fwd        forward, f32 and bf16, B=1, H=32, N, D=128, torch SDPA against
             flashattn.torch.scaled_dot_product_attention on the same BNSD tensors
             (and the C loop on them: "as fast as flashattn bench")
  fwdbwd     forward + backward, same shape, f32 and bf16
  mqa        forward + backward of one causal MQA sequence, B=1, Hq=8, Hk=1, N, D=128,
             f32 and bf16 (torch with enable_gqa): the shape whose single (sequence,
             kv head) walk makes flashattn's backward run two passes on 2+ threads
  sweep      (only when asked for) a matrix of other shapes, forward and forward +
             backward through the SDPA: dtypes, short and long N, batches, head dims,
             causal, GQA and MQA (SWEEP below), torch SDPA against flashattn SDPA
  pool       (only when asked for) the sweep's f32 shapes of N <= 256, where torch's
             spinning OpenMP workers compete with a second pool: torch SDPA against
             flashattn SDPA on its own threads and on torch's intra-op pool (the
             default since flashattn.torch hands it to the library), in one
             interleaved run
  decode     one query token against a KV cache of --decode-len keys (GQA 32/8), f32, bf16, f16:
             torch SDPA (enable_gqa) against flash_attn_with_kvcache, and the same
             call looped in C (flashattn._C.time_call_c: the Python layer's share)
  train      one training step (forward, backward, AdamW) of a small Llama-style
             model (transformers, random init) at sequence --train-seq, native
             "sdpa" against attn_implementation="fa_cpu"
  generate   greedy generation of 128 tokens with the KV cache, same two models
  memory     peak RSS of a fresh subprocess per variant that builds the model, runs
             one training step (so the optimizer state exists), resets the
             kernel's peak-RSS mark (/proc/self/clear_refs "5", Linux >= 4.0) and
             runs two more: the peak of those steps (VmHWM), and its growth over
             the RSS before them. tracemalloc cannot see torch's allocator, and a
             process per variant keeps one variant's peak from hiding the other's

GFLOP/s follow the repo's rule, counted by the library (flashattn.forward_work, fa_forward_work,
docs/semantics.md section 9): 2*(D+Dv) per kept (i, j) pair times B*H for a forward;
forward+backward adds its backward_flops, 3.5 times the forward's in all.

Run it through bench/python/run.sh (the venv with torch and transformers, and
the package installed from this clone). --smoke runs tiny shapes in seconds.
"""

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import flashattn
import flashattn.torch as fat
from flashattn import _C


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def interleaved(fns, runs, inner=None, warmup=2):
    """Median seconds per call of each fn in fns (a dict), timed in turns. Without
    `inner`, short calls are repeated so that one timing lasts ~20 ms or more."""
    slowest = 0.0
    for f in fns.values():
        for _ in range(warmup):
            t0 = time.perf_counter()
            f()
            slowest = max(slowest, time.perf_counter() - t0)
    if inner is None:
        inner = max(1, min(1000, int(0.02 / max(slowest, 1e-9))))
    times = {k: [] for k in fns}
    for _ in range(runs):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                f()
            times[k].append((time.perf_counter() - t0) / inner)
    return {k: statistics.median(v) for k, v in times.items()}


def sdpa_flops(q, k, v, causal, backward=False):
    """The library's FLOPs (flashattn.forward_work) of torch SDPA's call on BNSD q, k, v:
    causal is torch's is_causal (top-left); forward + backward when backward."""
    w = flashattn.forward_work(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                               causal="top-left" if causal else False)
    return w["flops"] + (w["backward_flops"] if backward else 0.0)


ROWS = []
PEAKS = {}  # fa_probe: "fma" and "bf16" GFLOP/s, "read_bw" GB/s


def probe_peaks(ctx):
    """fa_probe on flashattn's threads and ISA path: the peaks % of peak divides by."""
    for kind, key in ((_C.PROBE_FMA_PEAK, "fma"), (_C.PROBE_BF16_PEAK, "bf16"), (_C.PROBE_READ_BW, "read_bw")):
        try:
            PEAKS[key] = max(PEAKS.get(key, 0.0), _C.probe(ctx._c, kind))
        except RuntimeError:  # no bf16 dot product on this path
            pass
    log("peaks (fa_probe): " + ", ".join(f"{k} {v:.1f}" for k, v in PEAKS.items()))


def peak_of(case):
    """The peak a case's GFLOP/s is divided by: the bf16 dot-product peak for bf16
    (forward and backward multiply bf16 pairs on a path with them), else the fp32 FMA
    peak."""
    if "bfloat16" in case and "bf16" in PEAKS:
        return PEAKS["bf16"]
    return PEAKS.get("fma")


def row(case, variant, seconds, flops=None, extra=None, **shape):
    r = {"case": case, "variant": variant, "ms": seconds * 1e3, **shape}
    if flops:
        r["gflops"] = flops / seconds * 1e-9
        pk = peak_of(case)
        if pk and not case.startswith("decode"):
            r["pct_peak"] = 100.0 * r["gflops"] / pk
    if extra and "kv_GB/s" in extra and PEAKS.get("read_bw"):
        extra = dict(extra, pct_read_bw=100.0 * extra["kv_GB/s"] / PEAKS["read_bw"])
    if extra:
        r.update(extra)
    ROWS.append(r)
    return r


# ---------------------------------------------------------------- cases

def case_overhead(args, ctx):
    q = np.random.default_rng(0).standard_normal((1, 1, 1, 64)).astype(np.float32)
    o = np.empty_like(q)
    tq = torch.from_numpy(q)
    t4 = tq.view(1, 1, 1, 64)  # BNSD for the SDPAs (S = 1, H = 1: the same memory)
    inner = 2000 if not args.smoke else 200
    with ctx:
        c = ctx._c
        fns = {
            "C call (fa_forward loop in C)": lambda: _C.time_forward_c(c, q, q, q, o, inner),
            "binding (_C.forward, NumPy)": lambda: [_C.forward(c, q, q, q, o) for _ in range(inner)],
            "flash_attn_func (NumPy)": lambda: [flashattn.flash_attn_func(q, q, q) for _ in range(inner)],
            "flash_attn_func (torch)": lambda: [flashattn.flash_attn_func(tq, tq, tq) for _ in range(inner)],
            "flashattn.torch SDPA": lambda: [fat.scaled_dot_product_attention(t4, t4, t4) for _ in range(inner)],
            "torch SDPA": lambda: [F.scaled_dot_product_attention(t4, t4, t4) for _ in range(inner)],
        }
        med = interleaved(fns, args.runs * 3, inner=1)
    base = med["C call (fa_forward loop in C)"] / inner
    for k, v in med.items():
        per = v / inner
        row("overhead", k, per, extra={"us": per * 1e6, "us_above_c": (per - base) * 1e6}, B=1, H=1, S=1, D=64)


def fwdbwd_fns(q, k, v, dout, kw):
    """torch's SDPA and flashattn's, each a forward + backward on leaf copies of q, k, v."""
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

    def step(fn):
        def run():
            for x in (qg, kg, vg):
                x.grad = None
            fn(qg, kg, vg, **kw).backward(dout)
        return run

    return {"torch SDPA": step(F.scaled_dot_product_attention), "flashattn SDPA": step(fat.scaled_dot_product_attention)}


def case_fwd(args, ctx, dtype, N, backward=False, mqa=False, bshd=False):
    """bshd: q, k, v are (B, H, N, D) views of (B, N, H, D) memory, as a Hugging Face
    model hands them to SDPA (its projections, viewed per head and transposed)."""
    B, H, D = 1, (8 if mqa else args.heads), args.dim
    Hk = 1 if mqa else H
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(N)

    def draw(heads):
        if bshd:
            return torch.randn(B, N, heads, D, generator=g).to(dt).transpose(1, 2)
        return torch.randn(B, heads, N, D, generator=g).to(dt)

    q = draw(H)
    k, v = (draw(Hk) for _ in range(2))
    kw = {"is_causal": True, "enable_gqa": True} if mqa else {}
    flops = sdpa_flops(q, k, v, causal=mqa, backward=backward)
    with ctx:
        if not backward:
            out = torch.empty(B, N, H, D, dtype=dt)
            qs, ks, vs = (x.transpose(1, 2) for x in (q, k, v))
            from torch.utils.dlpack import to_dlpack as dl
            fns = {
                "torch SDPA": lambda: F.scaled_dot_product_attention(q, k, v),
                "flashattn SDPA": lambda: fat.scaled_dot_product_attention(q, k, v),
                "flashattn C loop": lambda: _C.time_forward_c(ctx._c, dl(qs), dl(ks), dl(vs), dl(out), 1),
            }
        else:
            fns = fwdbwd_fns(q, k, v, torch.randn(B, H, N, D, generator=g).to(dt), kw)
        med = interleaved(fns, args.runs)
    case = ("fwdbwd_mqa_" if mqa else "fwdbwd_" if backward else "fwd_bshd_" if bshd else "fwd_") + dtype
    shape = {"B": B, "Hq": H, "Hk": Hk} if mqa else {"B": B, "H": H}
    for kname, sec in med.items():
        row(case, kname, sec, flops, **shape, N=N, D=D)
    return med


# (dtype, B, Hq, Hk, N, D, causal, backward): shapes beside the headline ones
SWEEP = [
    ("float32", 1, 32, 32, 128, 128, False, False), ("float32", 1, 32, 32, 256, 128, False, False),
    ("float32", 1, 32, 32, 512, 128, False, False), ("float32", 1, 32, 32, 256, 64, False, False),
    ("float32", 8, 32, 32, 256, 128, False, False), ("float32", 1, 32, 32, 256, 128, True, False),
    ("float32", 1, 32, 32, 1024, 64, False, False), ("float32", 1, 32, 32, 4096, 128, True, False),
    ("float32", 4, 16, 16, 512, 64, True, False), ("float32", 16, 12, 12, 128, 64, False, False),
    ("float32", 1, 32, 8, 2048, 128, True, False), ("bfloat16", 1, 32, 32, 256, 128, False, False),
    ("bfloat16", 4, 16, 16, 512, 64, True, False), ("bfloat16", 1, 32, 8, 2048, 128, True, False),
    ("bfloat16", 1, 32, 32, 4096, 128, True, False), ("float16", 1, 32, 32, 256, 128, False, False),
    ("float16", 1, 32, 32, 1024, 128, False, False),
    ("float32", 1, 32, 32, 256, 128, False, True), ("float32", 16, 12, 12, 128, 64, False, True),
    ("float32", 1, 32, 8, 1024, 128, True, True), ("float32", 1, 8, 1, 2048, 128, True, True),
    ("bfloat16", 1, 32, 32, 256, 128, False, True), ("bfloat16", 1, 32, 8, 1024, 128, True, True),
    ("bfloat16", 1, 8, 1, 2048, 128, True, True), ("float16", 1, 32, 32, 1024, 128, False, True),
]


def under(c, fn):
    """fn on context c (`with c:`), for variants that differ only in the context."""
    def run():
        with c:
            fn()
    return run


def case_sweep(args, ctx, spec, pools=None):
    """pools: {name: context}: flashattn's variant once per context (case `pool`)."""
    dtype, B, Hq, Hk, N, D, causal, backward = spec
    if args.smoke:
        N = min(N, 64)
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(N)
    q = torch.randn(B, Hq, N, D, generator=g).to(dt)
    k, v = (torch.randn(B, Hk, N, D, generator=g).to(dt) for _ in range(2))
    kw = {"is_causal": causal, "enable_gqa": Hq != Hk}
    flops = sdpa_flops(q, k, v, causal, backward)
    if backward:
        fns = fwdbwd_fns(q, k, v, torch.randn(B, Hq, N, D, generator=g).to(dt), kw)
    else:
        fns = {"torch SDPA": lambda: F.scaled_dot_product_attention(q, k, v, **kw),
               "flashattn SDPA": lambda: fat.scaled_dot_product_attention(q, k, v, **kw)}
    if pools:
        fa = fns.pop("flashattn SDPA")
        fns.update({f"flashattn SDPA, {name}": under(c, fa) for name, c in pools.items()})
    with ctx:
        med = interleaved(fns, args.runs)
    case = (f"{'pool' if pools else 'sweep'}_{dtype}_{'fwdbwd' if backward else 'fwd'}{'_causal' if causal else ''}"
            f"_B{B}_H{Hq}/{Hk}_D{D}")
    for kname, sec in med.items():
        row(case, kname, sec, flops, B=B, Hq=Hq, Hk=Hk, N=N, D=D)


def python_vs_c(ctx, runs, call, *c_args, inner=20, **c_kw):
    """Median seconds per call of `call` (Python) and of the same forward looped in C
    (flashattn._C.time_call_c on c_args, c_kw: the arguments built once), in turns."""
    py, c = [], []
    for _ in range(2):
        call()
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(inner):
            call()
        py.append((time.perf_counter() - t0) / inner)
        c.append(_C.time_call_c(ctx._c, inner, *c_args, **c_kw))
    return statistics.median(py), statistics.median(c)


def case_decode(args, ctx, dtype):
    B, Hq, Hk, D, L = 1, 32, 8, args.dim, args.decode_len
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(1)
    kc = torch.randn(B, L + 1, Hk, D, generator=g).to(dt)  # BSND cache, room for the new token
    vc = torch.randn(B, L + 1, Hk, D, generator=g).to(dt)
    q = torch.randn(B, 1, Hq, D, generator=g).to(dt)
    kn = torch.randn(B, 1, Hk, D, generator=g).to(dt)
    vn = torch.randn(B, 1, Hk, D, generator=g).to(dt)
    seqlens = torch.full((B,), L, dtype=torch.int32)
    # torch reads the same cache memory as BNSD views, keys L+1 after the append
    kt, vt, qt = kc.transpose(1, 2), vc.transpose(1, 2), q.transpose(1, 2)
    with ctx:
        fns = {
            "torch SDPA": lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True),
            "flash_attn_with_kvcache": lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn,
                                                                                 cache_seqlens=seqlens),
        }
        med = interleaved(fns, args.runs * 4)
        med["flash_attn_with_kvcache"], med["flashattn C loop"] = python_vs_c(ctx, args.runs * 4, lambda: (
            flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens)),
            q, kn, vn, torch.empty(B, 1, Hq, D, dtype=dt), k_cache=kc, v_cache=vc, cache_seqlens=seqlens)
    kv_bytes = 2 * B * (L + 1) * Hk * D * kc.element_size()
    flops = flashattn.forward_work(q, kn, vn, k_cache=kc, v_cache=vc, cache_seqlens=seqlens)["flops"]
    for kname, sec in med.items():
        row("decode_" + dtype, kname, sec, flops,
            extra={"kv_GB/s": kv_bytes / sec * 1e-9}, B=B, Hq=Hq, Hk=Hk, L=L, D=D)


def llama_config(args):
    import transformers

    return transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                                    num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                                    num_key_value_heads=max(1, args.hidden // 128),
                                    max_position_embeddings=max(args.train_seq, 256) + 256)


def build_model(args, impl):
    import transformers

    import flashattn.transformers as fht

    name = fht.register()
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(llama_config(args),
                                                      attn_implementation="sdpa" if impl == "native" else name)


def case_train(args, ctx):
    models = {impl: build_model(args, impl) for impl in ("native", "flashattn")}
    models["flashattn"].load_state_dict(models["native"].state_dict())
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    ids = torch.randint(0, args.vocab, (1, args.train_seq), generator=torch.Generator().manual_seed(2))

    def step(k):
        def run():
            opts[k].zero_grad()
            models[k](ids, labels=ids).loss.backward()
            opts[k].step()
        return run

    with ctx:
        fat.reset_stats()
        med = interleaved({"native sdpa": step("native"), "flashattn (fa_cpu)": step("flashattn")},
                          max(3, args.runs // 2))
        routed = fat.stats()
    for k, sec in med.items():
        row("train_step", k, sec, extra={"routed": routed["routed"], "fallbacks": routed["fallbacks"]},
            seq=args.train_seq, layers=args.layers, hidden=args.hidden)


def case_generate(args, ctx):
    models = {impl: build_model(args, impl).eval() for impl in ("native", "flashattn")}
    models["flashattn"].load_state_dict(models["native"].state_dict())
    ids = torch.randint(0, args.vocab, (1, 32), generator=torch.Generator().manual_seed(3))
    n = args.gen_tokens
    outs = {}

    def gen(k):
        def run():
            with torch.no_grad():
                outs[k] = models[k].generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                             min_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=0)
        return run

    with ctx:
        med = interleaved({"native sdpa": gen("native"), "flashattn (fa_cpu)": gen("flashattn")},
                          max(3, args.runs // 2))
    same = torch.equal(outs["native"], outs["flashattn"])
    for k, sec in med.items():
        row("generate", k, sec, extra={"tokens/s": n / sec, "same_tokens": same}, tokens=n)


MEMORY_CHILD = r"""
import resource, sys, json, torch
sys.argv = ['bench_torch.py'] + json.loads(sys.argv[1])
sys.path.insert(0, %r)
import bench_torch as b
args = b.parse_args()
args.train_seq = args.mem_seq
torch.set_num_threads(args.threads)
m = b.build_model(args, args.mem_impl)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
ids = torch.randint(0, args.vocab, (1, args.train_seq))
import flashattn
def hwm():
    # the kernel's peak RSS (VmHWM), KiB
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0
with flashattn.Context(threads=args.threads):
    opt.zero_grad(); m(ids, labels=ids).loss.backward(); opt.step()  # optimizer state now exists
    before = rss()
    try:  # Linux >= 4.0: "5" resets VmHWM to the current RSS, so the peak is the steps'
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    for _ in range(2):
        opt.zero_grad(); m(ids, labels=ids).loss.backward(); opt.step()
peak = hwm()
print(json.dumps({"peak_kib": peak, "before_kib": before, "reset": reset}))
"""


def case_memory(args, seq):
    res = {}
    for impl in ("native", "flashattn"):
        a = strip_opt(strip_opt(sys.argv[1:], "--plot"), "--cases") + ["--mem-seq", str(seq), "--mem-impl", impl]
        code = MEMORY_CHILD % os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run([sys.executable, "-c", code, json.dumps(a)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"memory subprocess failed: {r.stderr[-2000:]}")
        res[impl] = json.loads(r.stdout.strip().splitlines()[-1])
    for impl, r in res.items():
        row("train_peak_rss", "native sdpa" if impl == "native" else "flashattn (fa_cpu)", 0.0,
            extra={"peak_MiB": r["peak_kib"] / 1024, "step_growth_MiB": (r["peak_kib"] - r["before_kib"]) / 1024,
                   "peak_of_steps_only": r["reset"]},
            seq=seq)
    return res


def strip_opt(argv, name):
    out, skip = [], False
    for i, x in enumerate(argv):
        if skip:
            skip = False
            continue
        if x == name:
            skip = True
            continue
        if x.startswith(name + "="):
            continue
        out.append(x)
    return out


# ---------------------------------------------------------------- output

def torch_capability():
    """The capability tier ATen's CPU kernels run at (ATEN_CPU_CAPABILITY caps it)."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # older torch
        return "unknown"


def print_table():
    cols = ["case", "variant", "shape", "ms", "GFLOP/s", "other"]
    lines = []
    for r in ROWS:
        shape = ",".join(f"{k}={r[k]}" for k in ("B", "H", "Hq", "Hk", "N", "S", "L", "D", "seq", "tokens") if k in r)
        other = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
                          if k in ("us", "us_above_c", "pct_peak", "kv_GB/s", "pct_read_bw", "tokens/s", "same_tokens", "routed", "fallbacks",
                                   "peak_MiB", "step_growth_MiB", "peak_of_steps_only"))
        ms = f"{r['ms']:.4g}" if r["ms"] else "-"
        gf = f"{r['gflops']:.1f}" if "gflops" in r else "-"
        lines.append([r["case"], r["variant"], shape, ms, gf, other])
    widths = [max(len(c), *(len(l[i]) for l in lines)) for i, c in enumerate(cols)] if lines else [len(c) for c in cols]
    fmt = " | ".join("{:<%d}" % w for w in widths)
    print(fmt.format(*cols))
    print("-+-".join("-" * w for w in widths))
    for l in lines:
        print(fmt.format(*l))
    # the ratios the targets are stated in
    by = {}
    for r in ROWS:
        by.setdefault((r["case"], r.get("N")), {})[r["variant"]] = r
    print()
    for (case, N), vs in by.items():
        for name in ("own threads", "torch's threads"):
            if "torch SDPA" in vs and f"flashattn SDPA, {name}" in vs:
                s = vs["torch SDPA"]["ms"] / vs[f"flashattn SDPA, {name}"]["ms"]
                print(f"# {case} N={N}: flashattn SDPA on {name} is {s:.2f}x torch SDPA")
        if "torch SDPA" in vs and "flashattn SDPA" in vs:
            s = vs["torch SDPA"]["ms"] / vs["flashattn SDPA"]["ms"]
            extra = ""
            if "flashattn C loop" in vs:
                extra = f"; Python/C loop {vs['flashattn SDPA']['ms'] / vs['flashattn C loop']['ms']:.3f}"
            print(f"# {case} N={N}: flashattn is {s:.2f}x torch SDPA{extra}")
        if "flash_attn_with_kvcache" in vs and "flashattn C loop" in vs:
            r = vs["flash_attn_with_kvcache"]["ms"] / vs["flashattn C loop"]["ms"]
            print(f"# {case}: flash_attn_with_kvcache / C loop {r:.3f} (issue 22: at most 1.10)")
        if "native sdpa" in vs and "flashattn (fa_cpu)" in vs and vs["native sdpa"]["ms"]:
            print(f"# {case}: flashattn is {vs['native sdpa']['ms'] / vs['flashattn (fa_cpu)']['ms']:.2f}x native")


def plot(path, seqs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for case, style in (("fwd_float32", "-"), ("fwd_bfloat16", "--"), ("fwdbwd_float32", ":"), ("fwdbwd_bfloat16", "-.")):
        for variant, color in (("torch SDPA", "tab:orange"), ("flashattn SDPA", "tab:blue")):
            pts = sorted((r["N"], r["ms"]) for r in ROWS if r["case"] == case and r["variant"] == variant)
            if pts:
                a1.plot(*zip(*pts), style, marker="o", color=color, label=f"{variant}, {case}")
    a1.set_xscale("log", base=2)
    a1.set_yscale("log")
    a1.set_xlabel(f"N (sequence length), B=1, H={ARGS.heads}, D={ARGS.dim}")
    a1.set_ylabel("median ms")
    a1.set_title("attention latency vs N")
    a1.legend(fontsize=7)
    for variant, color in (("native sdpa", "tab:orange"), ("flashattn (fa_cpu)", "tab:blue")):
        pts = sorted((r["seq"], r["step_growth_MiB"]) for r in ROWS
                     if r["case"] == "train_peak_rss" and r["variant"] == variant)
        if pts:
            a2.plot(*zip(*pts), marker="o", color=color, label=variant)
    a2.set_xscale("log", base=2)
    a2.set_xlabel("sequence length of the training step")
    a2.set_ylabel("peak RSS of the steps above the RSS before them, MiB")
    a2.set_title("small Llama training step: peak memory vs N")
    a2.legend(fontsize=8)
    title = f"flashattn vs torch {torch.__version__} SDPA, {torch.get_num_threads()} threads"
    if ARGS.smoke:
        title += " -- SMOKE RUN (tiny shapes), not figures"
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot written to {path}")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--seqs", default="2048", help="N for fwd/fwdbwd, comma separated (the plot's x axis)")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--decode-len", type=int, default=4096)
    p.add_argument("--train-seq", type=int, default=2048)
    p.add_argument("--mem-seqs", default=None, help="sequence lengths for the memory rows (default: --train-seq)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--cases", default="overhead,fwd,fwdbwd,mqa,decode,train,generate,memory",
                   help="comma separated; also sweep and pool, which run only when named")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, a few seconds: does the script work")
    p.add_argument("--json", action="store_true", help="one JSON object per row on stdout instead of the table")
    p.add_argument("--plot", default=None, help="PNG path: latency and memory against N")
    p.add_argument("--mem-impl", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mem-seq", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.smoke:
        a.runs, a.seqs, a.heads, a.dim, a.decode_len = 3, "64,128", 4, 32, 256
        a.train_seq, a.layers, a.hidden, a.vocab, a.gen_tokens = 64, 2, 128, 256, 8
        a.mem_seqs = a.mem_seqs or "64,128"
    return a


ARGS = None


def main():
    global ARGS
    ARGS = args = parse_args()
    torch.set_num_threads(args.threads)
    ctx = flashattn.Context(threads=args.threads)
    cases = args.cases.split(",")
    seqs = [int(s) for s in args.seqs.split(",")]
    mem_seqs = [int(s) for s in (args.mem_seqs or str(args.train_seq)).split(",")]
    plan = []
    if "overhead" in cases:
        plan.append(("overhead", lambda: case_overhead(args, ctx)))
    for N in seqs:
        if "fwd" in cases:
            for dt in ("float32", "bfloat16"):
                plan.append((f"fwd {dt} N={N}", lambda dt=dt, N=N: case_fwd(args, ctx, dt, N)))
        if "fwd_bshd" in cases:
            for dt in ("float32", "bfloat16"):
                plan.append((f"fwd {dt} N={N}, BSHD memory",
                             lambda dt=dt, N=N: case_fwd(args, ctx, dt, N, bshd=True)))
        if "fwdbwd" in cases:
            for dt in ("float32", "bfloat16"):
                plan.append((f"fwd+bwd {dt} N={N}", lambda dt=dt, N=N: case_fwd(args, ctx, dt, N, backward=True)))
        if "mqa" in cases:
            for dt in ("float32", "bfloat16"):
                plan.append((f"fwd+bwd MQA {dt} N={N}",
                             lambda dt=dt, N=N: case_fwd(args, ctx, dt, N, backward=True, mqa=True)))
    if "sweep" in cases:
        for spec in SWEEP:
            plan.append((f"sweep {spec}", lambda spec=spec: case_sweep(args, ctx, spec)))
    if "pool" in cases:
        own, host = flashattn.Context(threads=args.threads), flashattn.Context(threads=args.threads)
        own.pool = "own"
        host.pool = "host"  # raises without an OpenMP runtime: nothing to compare then
        pools = {"own threads": own, "torch's threads": host}
        for spec in (s for s in SWEEP if s[0] == "float32" and s[4] <= 256):
            plan.append((f"pool {spec}", lambda spec=spec: case_sweep(args, ctx, spec, pools)))
    if "decode" in cases:
        for dt in ("float32", "bfloat16", "float16"):
            plan.append((f"decode {dt}", lambda dt=dt: case_decode(args, ctx, dt)))
    if "train" in cases:
        plan.append((f"train step seq={args.train_seq}", lambda: case_train(args, ctx)))
    if "generate" in cases:
        plan.append((f"generate {args.gen_tokens} tokens", lambda: case_generate(args, ctx)))
    if "memory" in cases:
        for s in mem_seqs:
            plan.append((f"peak memory seq={s}", lambda s=s: case_memory(args, s)))
    probe_peaks(ctx)
    log(f"flashattn {flashattn.__version__} ({ctx.isa}), torch {torch.__version__}, {args.threads} threads, "
        f"{len(plan)} steps")
    t0 = time.time()
    for i, (name, fn) in enumerate(plan, 1):
        log(f"[{i}/{len(plan)}] {name} ({time.time() - t0:.0f} s so far)")
        fn()
    # probed again at the end: a peak is what the machine can do, so the larger
    # reading of the two counts (one probe disturbed by a neighbour reads low)
    probe_peaks(ctx)
    for r in ROWS:
        pk = peak_of(r["case"])
        if "gflops" in r and pk and not r["case"].startswith("decode"):
            r["pct_peak"] = 100.0 * r["gflops"] / pk
        if "kv_GB/s" in r and PEAKS.get("read_bw"):
            r["pct_read_bw"] = 100.0 * r["kv_GB/s"] / PEAKS["read_bw"]
    if args.json:
        for r in ROWS:  # each row names both tiers, so that a run shows them
            print(json.dumps({**r, "flashattn_isa": ctx.isa, "torch_capability": torch_capability()}))
    else:
        print("# peaks (fa_probe, this run): " + ", ".join(f"{k} {v:.1f}" for k, v in PEAKS.items()))
        print(f"# flashattn {flashattn.__version__} isa {ctx.isa}; torch {torch.__version__}; "
              f"{args.threads} threads both sides; medians of {args.runs} interleaved runs")
        print(f"# tiers: flashattn isa {ctx.isa} (FLASHATTN_ARCH={os.environ.get('FLASHATTN_ARCH', '')}); "
              f"torch capability {torch_capability()} (ATEN_CPU_CAPABILITY="
              f"{os.environ.get('ATEN_CPU_CAPABILITY', '')}, ONEDNN_MAX_CPU_ISA="
              f"{os.environ.get('ONEDNN_MAX_CPU_ISA', '')}, MKL_ENABLE_INSTRUCTIONS="
              f"{os.environ.get('MKL_ENABLE_INSTRUCTIONS', '')})")
        print_table()
    if args.plot:
        plot(args.plot, seqs)


if __name__ == "__main__":
    main()
