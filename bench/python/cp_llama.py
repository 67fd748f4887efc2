"""cp_llama.py: a small random-weight transformers Llama trained with its attention
sharded across processes by flashattn.torch.distributed (ring or Ulysses).

    HF_HUB_OFFLINE=1 torchrun --nproc-per-node 2 bench/python/cp_llama.py --method ring --steps 3

Every rank holds the same model (seeded) and this rank's rows of each sequence
(zig-zag by default, with their global position_ids for the rotary embedding); the
attention is a function registered with transformers' AttentionInterface that
calls ring_attention or ulysses_attention, causal, over the whole sequence. The
loss is each rank's sum of token losses over the global token count, so the sum
over ranks is the whole sequence's mean loss, and the parameter gradients are
summed over ranks (all_reduce) as data parallelism would. With --check each step
also runs one process's model on the whole sequence (attn_implementation fa_cpu,
flashattn) and prints the largest loss difference and relative gradient
difference. Per step it prints the time, the attention's compute and exposed
communication (flashattn.torch.distributed.stats()), and the share of the ring's
communication hidden: 1 - exposed / (the same transfers timed alone).
"""

import argparse
import copy
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

NAME = "fa_cp"


def _register(method, layout, group):
    from transformers import AttentionInterface

    import flashattn.torch.distributed as fd

    call = fd.ring_attention if method == "ring" else fd.ulysses_attention

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        # (B, H, S_r, D) in, (B, S_r, H, D) out; the shard's causal mask is the ring's
        q, k, v = (x.transpose(1, 2) for x in (query, key, value))
        return call(q, k, v, group=group, causal=True, scale=scaling, layout=layout), None

    AttentionInterface.register(NAME, attention)


def _comm_alone(nbytes, group, reps=5):
    """Seconds one ring exchange of nbytes takes with nothing else running (median)."""
    P, r = dist.get_world_size(group), dist.get_rank(group)
    if P == 1:
        return 0.0
    send = torch.zeros(nbytes // 4, dtype=torch.float32)
    recv = torch.empty_like(send)
    times = []
    for _ in range(reps + 1):
        dist.barrier(group)
        t0 = time.perf_counter()
        ws = [dist.isend(send, (r + 1) % P, group), dist.irecv(recv, (r - 1) % P, group)]
        for w in ws:
            w.wait()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def run(method="ring", layout="zigzag", steps=3, seq=512, hidden=256, layers=2, heads=8, kv_heads=4, check=True,
        verbose=True, lr=1e-3, vocab=256):
    """Trains `steps` steps; returns the largest differences from one process (with
    check) and the timings. torch.distributed must be initialised (gloo)."""
    import transformers

    import flashattn.torch.distributed as fd
    import flashattn.transformers as fht

    group = None
    P, rank = dist.get_world_size(), dist.get_rank()
    _register(method, layout, group)
    ref_name = fht.register()
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                   num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   max_position_embeddings=max(seq, 128), attention_dropout=0.0, use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=NAME)
    ref = None
    if check:
        ref = transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=ref_name)
        ref.load_state_dict(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr) if ref is not None else None
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (1, seq), generator=gen)
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]  # next-token targets of the whole sequence, then sharded with it
    count = int((labels != -100).sum())
    ids_l = fd.shard(ids, layout=layout)
    labels_l = fd.shard(labels, layout=layout)
    pos_l = fd.positions(seq, layout=layout)[None]
    ce = torch.nn.CrossEntropyLoss(reduction="sum", ignore_index=-100)

    # the transfers of one ring call, timed alone: the forward sends P-1 k/v shards,
    # the backward P-1 k/v shards and P-1 f32 dK/dV accumulators (the last one home)
    head_dim = hidden // heads
    kv_bytes = seq // P * kv_heads * 2 * head_dim * 4
    alone_kv, alone_acc = _comm_alone(kv_bytes, group), _comm_alone(kv_bytes, group)
    comm_fwd = (P - 1) * alone_kv * layers
    comm_bwd = (P - 1) * (alone_kv + alone_acc) * layers

    result = {"max_loss_diff": 0.0, "max_grad_rel": 0.0, "steps": []}
    for step in range(steps):
        fd.reset_stats()
        dist.barrier()
        t0 = time.perf_counter()
        logits = model(input_ids=ids_l, position_ids=pos_l).logits
        loss = ce(logits.flatten(0, 1).float(), labels_l.flatten()) / count
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)  # each rank holds its shard's part of every parameter's gradient
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()
        total = loss.detach().clone()
        dist.all_reduce(total)
        t_step = time.perf_counter() - t0
        st = fd.stats()
        if ref is not None:
            ref_logits = ref(input_ids=ids).logits
            ref_loss = ce(ref_logits.flatten(0, 1).float(), labels.flatten()) / count
            ref_loss.backward()
            result["max_loss_diff"] = max(result["max_loss_diff"], abs(total.item() - ref_loss.item()))
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                scale = q.grad.abs().max().item() or 1.0
                result["max_grad_rel"] = max(result["max_grad_rel"], (p.grad - q.grad).abs().max().item() / scale)
            ref_opt.step()
            ref_opt.zero_grad()
        opt.step()
        opt.zero_grad()
        row = {"step": step, "loss": total.item(), "seconds": t_step}
        if method == "ring":
            f, b = st.get("ring_forward", {}), st.get("ring_backward", {})
            row.update(attn_fwd=f.get("total", 0.0), attn_bwd=b.get("total", 0.0),
                       exposed_fwd=f.get("exposed", 0.0), exposed_bwd=b.get("exposed", 0.0),
                       hidden_fwd=1 - f.get("exposed", 0.0) / comm_fwd if comm_fwd else 1.0,
                       hidden_bwd=1 - b.get("exposed", 0.0) / comm_bwd if comm_bwd else 1.0)
        else:
            u = st.get("ulysses", {})
            row.update(attn_fwd=u.get("total", 0.0), all_to_all_fwd=u.get("exposed", 0.0))
        result["steps"].append(row)
        if verbose and rank == 0:
            extra = (f"  attention fwd {row['attn_fwd'] * 1e3:.1f} ms, bwd {row['attn_bwd'] * 1e3:.1f} ms; "
                     f"communication hidden fwd {100 * row['hidden_fwd']:.1f}%, bwd {100 * row['hidden_bwd']:.1f}% "
                     f"(exposed {1e3 * row['exposed_fwd']:.2f} / {1e3 * row['exposed_bwd']:.2f} ms of "
                     f"{1e3 * comm_fwd:.2f} / {1e3 * comm_bwd:.2f} ms alone)" if method == "ring" else
                     f"  attention fwd {row['attn_fwd'] * 1e3:.1f} ms, of which all-to-all (not hidden) "
                     f"{row['all_to_all_fwd'] * 1e3:.1f} ms")
            print(f"step {step}: loss {row['loss']:.6f}, {t_step * 1e3:.1f} ms/step{extra}", flush=True)
    if verbose and rank == 0 and check:
        print(f"against one process on the whole sequence: max |loss diff| {result['max_loss_diff']:.3g}, "
              f"max gradient diff / max |gradient| {result['max_grad_rel']:.3g}", flush=True)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", choices=("ring", "ulysses"), default="ring")
    ap.add_argument("--layout", choices=("zigzag", "contiguous"), default="zigzag")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq", type=int, default=512, help="tokens of the whole sequence")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch and flashattn threads per process")
    ap.add_argument("--no-check", action="store_true", help="skip the one-process comparison")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    import flashattn

    with flashattn.Context(threads=args.threads):
        if dist.get_rank() == 0:
            print(f"cp_llama: {dist.get_world_size()} processes x {args.threads} thread(s), {args.method} "
                  f"({args.layout}), seq {args.seq}, hidden {args.hidden}, {args.layers} layers, heads "
                  f"{args.heads}/{args.kv_heads}", flush=True)
        run(method=args.method, layout=args.layout, steps=args.steps, seq=args.seq, hidden=args.hidden,
            layers=args.layers, heads=args.heads, kv_heads=args.kv_heads, check=not args.no_check)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
