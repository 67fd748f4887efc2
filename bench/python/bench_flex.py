#!/usr/bin/env python3
"""bench_flex.py: flashattn.flex_attention against the dense-mask call and torch's flex_attention.

Owns the Python figures of issue 32. One interleaved run per (mask, dtype), medians,
B=1, H=32, N, D=128 (--heads, --seq, --dim), the same tensors and thread count on
every side:

  fwd      flashattn.flex_attention with the BlockMask; flashattn's SDPA with the
           same mask as a dense bool tensor (flashattn.torch, BNSD); torch's
           torch.compile(flex_attention) with the same BlockMask
  fwdbwd   forward + backward: flashattn.flex_attention; flashattn's SDPA with the
           dense bool mask; torch's SDPA with it (torch's FlexAttention has no
           backward on CPU)
  tree     a speculative tree of --tree draft tokens over a cache of N keys, forward:
           flashattn.flex_attention, flash_attn_with_kvcache(tree_mask=...) (the
           decoding call), the dense-mask SDPA, torch's compiled flex_attention

Masks (create_block_mask, blocks of 128): document (8 documents, causal within each),
prefix-LM (a quarter bidirectional, then causal), random block sparsity 10/25/50%
(whole kv blocks kept at random), and the tree. The table gives milliseconds and the
ratios other / flashattn.flex_attention; density is the BlockMask's kept fraction.
Run it through bench/python/run.sh --flex [args], or with the package on PYTHONPATH;
--smoke runs tiny shapes.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, create_mask
from torch.nn.attention.flex_attention import flex_attention as torch_flex

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch import interleaved, log  # noqa: E402

import flashattn  # noqa: E402
import flashattn.torch as fat  # noqa: E402


def masks(N, tree):
    """name -> (mask_mod, Q_LEN, KV_LEN)."""
    g = torch.Generator().manual_seed(0)
    cuts = torch.sort(torch.randperm(N - 1, generator=g)[:7] + 1).values
    lengths = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([N])]))
    doc = torch.repeat_interleave(torch.arange(8), lengths)
    out = {"document8": (lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv), N, N)}
    prefix = N // 4
    out["prefix_lm"] = (lambda b, h, q, kv: (kv < prefix) | (q >= kv), N, N)
    nb = -(-N // 128)
    for pct in (10, 25, 50):
        keep = torch.rand(nb, nb, generator=torch.Generator().manual_seed(pct)) < pct / 100
        keep |= torch.eye(nb, dtype=torch.bool)  # no empty q block
        out[f"random{pct}"] = ((lambda keep: lambda b, h, q, kv: keep[q // 128, kv // 128])(keep), N, N)
    # a draft tree: token i's parent is a random earlier token
    parent = [0] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, tree)]
    t = torch.zeros(tree, tree, dtype=torch.bool)
    for i in range(tree):
        t[i, i] = True
        if i:
            t[i] |= t[parent[i]]
    cache = N - tree
    out["tree"] = (lambda b, h, q, kv: (kv < cache) | t[q, (kv - cache).clamp(min=0)], tree, N)
    return out, t


def run(args):
    torch.set_num_threads(args.threads)
    torch._dynamo.config.cache_size_limit = 256  # one compile per mask and dtype, never the unfused fallback
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 256
    compiled = torch.compile(torch_flex, dynamic=False)
    H, D, N = args.heads, args.dim, args.seq
    rows = []
    all_masks, tree_bool = masks(N, args.tree)
    for name, (mod, Sq, Sk) in all_masks.items():
        if args.only and name not in args.only:
            continue
        bm = create_block_mask(mod, None, None, Sq, Sk, device="cpu")
        dense = create_mask(mod, 1, 1, Sq, Sk, device="cpu")
        density = 1.0 - bm.sparsity() / 100
        for dtype in args.dtypes:
            dt = getattr(torch, dtype)
            g = torch.Generator().manual_seed(1)
            q = torch.randn(1, H, Sq, D, generator=g).to(dt)
            k = torch.randn(1, H, Sk, D, generator=g).to(dt)
            v = torch.randn(1, H, Sk, D, generator=g).to(dt)
            log(f"{name} {dtype} N={N} density={density:.3f}: fwd")
            fns = {
                "flashattn flex": lambda: flashattn.flex_attention(q, k, v, block_mask=bm),
                "flashattn dense mask": lambda: fat.scaled_dot_product_attention(q, k, v, attn_mask=dense),
                "torch compiled flex": lambda: compiled(q, k, v, block_mask=bm),
            }
            if args.no_dense:
                del fns["flashattn dense mask"]
            if name == "tree":
                kc = k.transpose(1, 2).contiguous()
                vc = v.transpose(1, 2).contiguous()
                qb = q.transpose(1, 2).contiguous()
                kn, vn = kc[:, N - Sq:].clone(), vc[:, N - Sq:].clone()
                lens = torch.tensor([N - Sq], dtype=torch.int32)
                fns["flashattn kvcache tree_mask"] = lambda: flashattn.flash_attn_with_kvcache(
                    qb, kc, vc, kn, vn, cache_seqlens=lens, tree_mask=tree_bool)
            with torch.no_grad():
                med = interleaved(fns, args.runs, inner=1, warmup=args.warmup)
            rows.append((name, dtype, "fwd", density, med, "flashattn flex"))
            if name == "tree" or args.no_backward:
                continue
            log(f"{name} {dtype} N={N}: fwd+bwd")
            qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
            dout = torch.randn(1, H, Sq, D, generator=g).to(dt)

            def fb(f):
                def go():
                    out = f()
                    torch.autograd.grad(out, (qg, kg, vg), dout)
                return go

            fns = {
                "flashattn flex": fb(lambda: flashattn.flex_attention(qg, kg, vg, block_mask=bm)),
                "flashattn dense mask": fb(lambda: fat.scaled_dot_product_attention(qg, kg, vg, attn_mask=dense)),
                "torch sdpa dense mask": fb(lambda: F.scaled_dot_product_attention(qg, kg, vg, attn_mask=dense)),
            }
            if args.no_dense:
                del fns["flashattn dense mask"]
            med = interleaved(fns, args.runs, inner=1, warmup=args.warmup)
            rows.append((name, dtype, "fwd+bwd", density, med, "flashattn flex"))
    return rows


def table(rows, args):
    print(f"# bench_flex: B=1 H={args.heads} N={args.seq} D={args.dim}, {args.threads} threads, medians of "
          f"{args.runs} interleaved runs after {args.warmup} warm-up(s) each; load: {os.getloadavg()[0]:.2f}")
    print("| mask | dtype | pass | density | variant | ms | / flashattn flex |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, dtype, what, density, med, base in rows:
        for variant, s in med.items():
            print(f"| {name} | {dtype} | {what} | {density:.3f} | {variant} | {s * 1e3:.1f} | {s / med[base]:.2f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--tree", type=int, default=64, help="draft tokens of the tree case")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2, help="untimed calls of each variant first")
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--only", nargs="*", help="mask names to run (document8 prefix_lm random10 ...)")
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--no-dense", action="store_true", help="leave out flashattn's dense-mask calls, forward and backward (long N)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, two runs")
    args = p.parse_args()
    if args.smoke:
        args.seq, args.heads, args.dim, args.tree, args.runs = 512, 2, 64, 16, 2
    flashattn.current_context()  # the library's threads follow torch's pool (flashattn.torch)
    table(run(args), args)


if __name__ == "__main__":
    main()
