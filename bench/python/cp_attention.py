"""cp_attention.py: times flashattn.torch.distributed (ring, Ulysses) against one process.

    torchrun --nproc-per-node 2 bench/python/cp_attention.py --s-local 4096 --heads 8 --dim 128

Each rank holds S_local rows of a causal (or --no-causal) self-attention sequence
in the zig-zag layout, f32, one thread per process (torch and flashattn). Per mode
it prints the forward and forward+backward seconds per process (the slowest rank,
median of --iters), and for the ring the share of communication hidden,
1 - exposed / total comm, as bench.c of libflashattn_mpi defines it: exposed = the
wait for transfers after each step's compute (it also holds skew between ranks);
total comm = the same transfers timed alone (a ring exchange of one k/v shard, and
in the backward of one f32 dK/dV accumulator as well, (P - 1) times each). Rank 0
then runs one process on the whole sequence with --ref-threads threads (the other
ranks wait), for the ratio.
"""

import argparse
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def _exchange(nelem, reps=3):
    P, r = dist.get_world_size(), dist.get_rank()
    send, recv = torch.zeros(nelem), torch.empty(nelem)
    times = []
    for _ in range(reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        for w in (dist.isend(send, (r + 1) % P, tag=9), dist.irecv(recv, (r - 1) % P, tag=9)):
            w.wait()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _slowest(x):
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--s-local", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--modes", default="ring,ulysses,one", help="comma list of ring, ulysses, one")
    ap.add_argument("--ref-threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=1800))
    import flashattn
    import flashattn.torch.distributed as fd

    P, rank = dist.get_world_size(), dist.get_rank()
    causal = not args.no_causal
    S, H, D = args.s_local, args.heads, args.dim
    N = S * P
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(1, N, H, D, generator=g) for _ in range(4)]
    mine = [fd.shard(x, layout="zigzag") for x in full]
    modes = args.modes.split(",")
    kv_elems = S * H * 2 * D
    alone = _exchange(kv_elems)  # the k/v shard; the f32 accumulator has the same size in f32
    comm_fwd, comm_bwd = (P - 1) * alone, 2 * (P - 1) * alone
    if rank == 0:
        print(f"cp_attention: {P} processes x 1 thread, f32, S = {P} x {S}, H = {H}, D = {D}, "
              f"{'causal zig-zag' if causal else 'non-causal zig-zag'}; one k/v exchange alone {alone * 1e3:.1f} ms",
              flush=True)
    with flashattn.Context(threads=1):
        for mode in [m for m in modes if m in ("ring", "ulysses")]:
            call = fd.ring_attention if mode == "ring" else fd.ulysses_attention
            fwd, both, exp_f, exp_b = [], [], [], []
            for _ in range(args.iters):
                q, k, v = (x.clone().requires_grad_() for x in mine[:3])
                dist.barrier()
                fd.reset_stats()
                t0 = time.perf_counter()
                o = call(q, k, v, causal=causal)
                t1 = time.perf_counter()
                o.backward(mine[3])
                t2 = time.perf_counter()
                st = fd.stats()
                fwd.append(_slowest(t1 - t0))
                both.append(_slowest(t2 - t0))
                if mode == "ring":
                    exp_f.append(_slowest(st["ring_forward"]["exposed"]))
                    exp_b.append(_slowest(st["ring_backward"]["exposed"]))
                else:
                    exp_f.append(_slowest(st["ulysses"]["exposed"]))
            if rank == 0:
                line = (f"{mode:8s} forward {statistics.median(fwd):7.3f} s   forward+backward "
                        f"{statistics.median(both):7.3f} s")
                if mode == "ring":
                    ef, eb = statistics.median(exp_f), statistics.median(exp_b)
                    line += (f"   hidden: forward {100 * (1 - ef / comm_fwd):.1f}% (exposed {ef * 1e3:.1f} of "
                             f"{comm_fwd * 1e3:.1f} ms), backward {100 * (1 - eb / comm_bwd):.1f}% (exposed "
                             f"{eb * 1e3:.1f} of {comm_bwd * 1e3:.1f} ms)")
                else:
                    line += f"   forward all-to-alls (not overlapped) {statistics.median(exp_f) * 1e3:.1f} ms"
                print(line, flush=True)
    if "one" in modes:
        if rank == 0:
            fwd, both = [], []
            with flashattn.Context(threads=args.ref_threads):
                torch.set_num_threads(args.ref_threads)
                for _ in range(args.iters):
                    q, k, v = (x.clone().requires_grad_() for x in full[:3])
                    t0 = time.perf_counter()
                    o = flashattn.flash_attn_func(q, k, v, causal=causal)
                    t1 = time.perf_counter()
                    o.backward(full[3])
                    t2 = time.perf_counter()
                    fwd.append(t1 - t0)
                    both.append(t2 - t0)
            print(f"{'one':8s} forward {statistics.median(fwd):7.3f} s   forward+backward {statistics.median(both):7.3f} s"
                  f"   (1 process x {args.ref_threads} threads, the whole sequence)", flush=True)
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
