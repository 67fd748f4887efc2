#!/usr/bin/env python3
"""scaling_model.py: the ring-attention model of docs/scaling.md, as a program.

Prints the tables of docs/scaling.md from the per-core rate, the cores per rank,
the links and the model shape; rerun it with measured rates to update the doc:

    python3 mpi/scaling_model.py --gflops-per-core 100 --cores 96
    python3 mpi/scaling_model.py --check --gflops-per-core 85 --ping-gbs 6.1 \
        --s-local 4096 --heads 8 --kv-heads 8 --dim 128     # the 2-rank bench shape

Formulas (D = Dv, f = bytes per element, R = per-rank rate in FLOP/s, W = link
bandwidth in bytes/s, a = per-message latency):
    full block    T_full = 4 B H S^2 D / R                 (2 (D + Dv) per kept pair)
    causal zz     T_zz   = T_full / 2 every step           (two of the four chunk pairs,
                                                             see docs/scaling.md)
    forward comm  T_kv   = 2 B Hk S D f / W + a            (k and v of one shard)
    backward      compute 2.5 x the forward's, comm 2 B Hk S D (f + 4) / W + a
                  (k/v plus the f32 dK/dV accumulators that travel with them)
    step time     max(compute, comm)                       (overlap hides the smaller)
    ring time     zig-zag P * step(T_zz); contiguous (P - 1) * step(T_full) + T_full / 2
    efficiency    (causal FLOPs / (P R)) / ring time
"""
import argparse
import math


def hide_length(c_per_s2, b_per_s, alpha):
    """Smallest S with c S^2 >= b S + alpha."""
    return (b_per_s + math.sqrt(b_per_s * b_per_s + 4.0 * c_per_s2 * alpha)) / (2.0 * c_per_s2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gflops-per-core", type=float, default=100.0,
                    help="forward GFLOP/s per core (PLACEHOLDER 100 until measured)")
    ap.add_argument("--cores", type=int, nargs="+", default=[32, 96], help="cores per rank")
    ap.add_argument("--links-gbit", type=float, nargs="+", default=[100.0, 400.0])
    ap.add_argument("--latency-us", type=float, default=5.0)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--esize", type=int, default=4, help="bytes per element (f32 4, bf16 2)")
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--check", action="store_true", help="the per-step figures of one measured shape")
    ap.add_argument("--s-local", type=int, default=4096)
    ap.add_argument("--ping-gbs", type=float, default=0.0, help="measured ring-exchange GB/s (bench's k/v line)")
    a = ap.parse_args()
    B, H, Hk, D, f = a.batch, a.heads, a.kv_heads, a.dim, a.esize
    alpha = a.latency_us * 1e-6

    if a.check:
        S, R = a.s_local, a.gflops_per_core * 1e9 * a.cores[0]
        t_full = 4.0 * B * H * S * S * D / R
        kv = 2.0 * B * Hk * S * D * f
        t_kv = kv / (a.ping_gbs * 1e9) if a.ping_gbs > 0 else float("nan")
        acc = 2.0 * B * Hk * S * D * 4
        t_acc = (kv + acc) / (a.ping_gbs * 1e9) if a.ping_gbs > 0 else float("nan")
        print(f"S_local={S} H={H} Hk={Hk} D={D} f={f}, R={R/1e9:.0f} GFLOP/s per rank")
        print(f"  forward step: compute {t_full*1e3:.1f} ms (non-causal), {t_full/2*1e3:.1f} ms (causal zig-zag); "
              f"k/v {kv/2**20:.1f} MiB -> {t_kv*1e3:.2f} ms")
        print(f"  backward step: compute {2.5*t_full*1e3:.1f} ms (non-causal); k/v + dK/dV {(kv+acc)/2**20:.1f} MiB "
              f"-> {t_acc*1e3:.2f} ms")
        print(f"  compute / comm: forward {t_full/t_kv:.0f}x, backward {2.5*t_full/t_acc:.0f}x")
        return

    print(f"shape B={B} H={H} Hk={Hk} D={D}, {f}-byte elements; latency {a.latency_us:g} us; "
          f"rate {a.gflops_per_core:g} GFLOP/s per core")
    print()
    print("Shard length S* at which one step's communication hides behind its compute")
    print("| cores/rank | link | fwd non-causal | fwd causal zig-zag | bwd non-causal | bwd causal zig-zag |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for cores in a.cores:
        R = a.gflops_per_core * 1e9 * cores
        for gbit in a.links_gbit:
            W = gbit * 1e9 / 8
            c_f = 4.0 * B * H * D / R
            b_f = 2.0 * B * Hk * D * f / W
            b_b = 2.0 * B * Hk * D * (f + 4) / W
            row = [hide_length(c_f, b_f, alpha), hide_length(c_f / 2, b_f, alpha),
                   hide_length(2.5 * c_f, b_b, alpha), hide_length(2.5 * c_f / 2, b_b, alpha)]
            print(f"| {cores} | {gbit:g} Gb/s | " + " | ".join(f"{x:,.0f}" for x in row) + " |")
    print()
    N = a.tokens
    for cores in a.cores:
        R = a.gflops_per_core * 1e9 * cores
        print(f"Causal forward over N = {N:,} tokens, {cores} cores per rank ({R/1e12:.2f} TFLOP/s per rank)")
        links = " | ".join(f"comm {g:g} Gb/s" for g in a.links_gbit)
        effs = " | ".join(f"zig-zag eff {g:g}" for g in a.links_gbit)
        print(f"| P | S_local | step compute (zig-zag) | {links} | zig-zag ring | {effs} | contiguous ring | contiguous eff |")
        print("| ---: " * (6 + 2 * len(a.links_gbit)) + "|")
        for P in (8, 16, 32, 64, 128, 256, 512, 1024):
            S = N / P
            t_full = 4.0 * B * H * S * S * D / R
            t_zz = t_full / 2
            ideal = (2.0 * B * H * N * N * D) / (P * R)  # causal FLOPs / (P R)
            t_m = [2.0 * B * Hk * S * D * f / (g * 1e9 / 8) + alpha for g in a.links_gbit]
            # the ring time shown is the first link's (the slower); both hide here unless marked
            ring_zz = [P * max(t_zz, m) for m in t_m]
            ring_ct = (P - 1) * max(t_full, t_m[0]) + t_full / 2
            print(f"| {P} | {S:,.0f} | {fmt(t_zz)} | " + " | ".join(fmt(m) for m in t_m) + f" | {fmt(ring_zz[0])} | "
                  + " | ".join(f"{100*ideal/r:.0f}%" for r in ring_zz) + f" | {fmt(ring_ct)} | {100*ideal/ring_ct:.0f}% |")
        print()

def fmt(t):
    return f"{t*1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


if __name__ == "__main__":
    main()
