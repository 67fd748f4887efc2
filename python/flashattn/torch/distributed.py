"""flashattn.torch.distributed: context parallelism over torch.distributed.

Owns attention over a sequence sharded across the ranks of a process group, for
PyTorch code on CPUs (torch's own context_parallel intercepts only CUDA kernels):
  - ring_attention: k/v shards travel around the ring with isend/irecv while the
    local flashattn call runs; partial (o, lse) merge in f32 with fa_merge_states;
    the backward sends the k/v shards round again, followed by their f32 dK/dV
    accumulators, and runs fa_backward with the forward's global o and lse;
  - ulysses_attention: an all-to-all from sequence shards to head groups, one local
    flashattn call over the whole sequence, an all-to-all back;
  - attention sinks in both (the ring merges them in once, after its blocks);
  - shard / unshard / positions: a full sequence to this rank's rows and back, in
    the contiguous or the zig-zag layout (zig-zag balances causal work);
  - the agreement: every rank checks its arguments (the core's own validation, by a
    zero-row call) and all ranks exchange verdicts before any data moves, so a bad
    argument on one rank raises the same exception on every rank instead of a hang.
The rules are the library's: where each rank's rows sit, which core calls each ring
step makes, their q_start/k_start and kept pairs come from its ring planner (the one
libflashattn_mpi's ring asks, docs/mpi.md), through _C.ring_plan; this module moves
the tensors.

Legend: P ranks, r this rank, B batch, S_r rows of rank r (S_local), N = sum S_r,
Hq/Hk heads, D/Dv head dims. Shards are (B, S_r, H, D), flash-attn's layout.
"""

import time

import torch
import torch.distributed as dist

from .. import _C, _core
from ._ops import _dl, attention as _attention

__all__ = ["ring_attention", "ulysses_attention", "shard", "unshard", "positions", "stats", "reset_stats", "LAYOUTS"]

LAYOUTS = ("zigzag", "contiguous")
_f32 = torch.float32

# What the calls of this process measured, by kind: the last call, and sums since
# reset_stats() (see stats()).
_last = {}
_sums = {}


def _record(kind, **figures):
    _last[kind] = figures
    acc = _sums.setdefault(kind, {"calls": 0})
    acc["calls"] += 1
    for key, val in figures.items():
        acc[key] = acc.get(key, 0) + val


def stats(last=False):
    """This process's timings by kind ("ring_forward", "ring_backward", "ulysses"):
    total, compute (the flashattn calls), exposed (waiting for transfers after the
    compute, which also holds any skew between ranks; for Ulysses the all-to-alls),
    bytes_sent, in seconds and bytes; summed over the calls since reset_stats()
    (with "calls"), or those of the last call of each kind (last=True)."""
    return {k: dict(v) for k, v in (_last if last else _sums).items()}


def reset_stats():
    _last.clear()
    _sums.clear()


# ------------------------------------------------------------------ layouts


def _rank_world(group, rank, world_size):
    if world_size is None:
        world_size = dist.get_world_size(group)
    if rank is None:
        rank = dist.get_rank(group)
    return rank, world_size


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _ring_plan(layout, lengths, rank=0, causal=False, wl=-1, wr=-1, alibi=False, p=0.0, blocks=(), ctx=True):
    """The library's ring planner (fa_ring_placement, fa_ring_step, fa_ring_block):
    every rank's segments, runs of rows contiguous in the whole sequence as (global
    position, rows, first row in the shard); this rank's pieces per step, each a core
    call (q_row, rows, k_row, keys, q_pos, k_pos, q_start, k_start, causal, kept,
    diagonal); and `blocks`, (q_pos, rows, k_pos, keys), placed and counted alike.
    One call per block of a step (pieces=1); a step that reads no position is one
    call on the whole shards. ctx=False: the segments alone, without a context."""
    return _C.ring_plan(_core.current_context() if ctx else None, [int(x) for x in lengths], rank, layout == "zigzag",
                        _core.CAUSAL_TOP_LEFT if causal else _core.CAUSAL_NONE, wl, wr, alibi, p, pieces=1,
                        whole_shards=True, blocks=[list(b) for b in blocks])


def _segments(layout, lengths):
    """Every rank's segments (global position, rows, first row in the shard): one
    (contiguous), or two (zig-zag: chunks r and 2P-1-r of 2P), by the library's rule."""
    return _ring_plan(layout, lengths, ctx=False)["segments"]


def _lengths_of(n, world_size, layout, lengths):
    if lengths is None:
        per = 2 * world_size if layout == "zigzag" else world_size
        if n % per:
            raise ValueError(f"a sequence of {n} rows does not cut into {per} equal "
                             f"{'chunks (zig-zag: 2 per rank)' if layout == 'zigzag' else 'shards'}")
        return [n // world_size] * world_size
    lengths = [int(s) for s in lengths]
    if len(lengths) != world_size or sum(lengths) != n or min(lengths) < 0:
        raise ValueError(f"lengths {lengths} must give {world_size} shard lengths summing to {n}")
    if layout == "zigzag" and any(s % 2 for s in lengths):
        raise ValueError(f"zig-zag shard lengths must be even, got {lengths}")
    return lengths


def positions(n, *, group=None, layout="zigzag", lengths=None, rank=None, world_size=None):
    """The global positions (int64, (S_r,)) of this rank's rows of an n-row sequence:
    e.g. the position_ids a model with rotary embeddings needs for its shard.
    lengths: every rank's shard length (default: n split equally)."""
    _check_layout(layout)
    rank, world_size = _rank_world(group, rank, world_size)
    lengths = _lengths_of(n, world_size, layout, lengths)
    return torch.cat([torch.arange(p, p + m, dtype=torch.int64) for p, m, _ in _segments(layout, lengths)[rank]])


def shard(x, *, dim=1, group=None, layout="zigzag", lengths=None, rank=None, world_size=None):
    """This rank's shard of a full tensor x along dim (default 1: (B, S, H, D)), a new
    tensor, differentiable. lengths: every rank's shard length (default equal)."""
    idx = positions(x.shape[dim], group=group, layout=layout, lengths=lengths, rank=rank, world_size=world_size)
    return x.index_select(dim, idx)


def unshard(x, *, dim=1, group=None, layout="zigzag"):
    """The full tensor from every rank's shard x along dim, on every rank (a collective;
    shard lengths may differ and are exchanged). Not differentiable."""
    _check_layout(layout)
    P = dist.get_world_size(group)
    x = x.detach().movedim(dim, 0).contiguous()
    n = torch.tensor([x.shape[0]], dtype=torch.int64)
    ns = [torch.zeros_like(n) for _ in range(P)]
    dist.all_gather(ns, n, group=group)
    lengths = [int(t) for t in ns]
    top = max(lengths)
    padded = torch.zeros((top,) + tuple(x.shape[1:]), dtype=x.dtype)
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in range(P)]
    dist.all_gather(parts, padded, group=group)
    full = torch.empty((sum(lengths),) + tuple(x.shape[1:]), dtype=x.dtype)
    segments = _segments(layout, lengths)
    for r in range(P):
        for p, m, off in segments[r]:
            full[p:p + m] = parts[r][off:off + m]
    return full.movedim(0, dim)


# ------------------------------------------------------------------ agreement


class _Plan:
    """What every rank agreed on: the group, the ranks' shard lengths, the options."""

    __slots__ = ("group", "P", "rank", "lengths", "layout", "causal", "wl", "wr", "scale", "softcap", "alibi", "p",
                 "seed", "offset", "band_offsets", "ctx", "peers", "sinks", "sinks_grad", "steps", "opts")


def _options(causal, window, softcap, alibi_slopes, dropout_p, scale, layout, dropout_seed, dropout_offset):
    _check_layout(layout)
    # one sequence attends to itself: both causal alignments keep j <= i
    causal = _core.causal_of(causal) != _core.CAUSAL_NONE
    wl, wr = (-1, -1) if window is None else _core.window_of(window)
    softcap = float(softcap)
    if not softcap >= 0.0:
        raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap}")
    p = float(dropout_p)  # its range is the library's rule: the zero-row check call judges it
    seed = 0
    if p > 0:
        seed = int(dropout_seed) if dropout_seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        if not 0 <= seed < 2**63:
            raise ValueError("dropout_seed must lie in [0, 2^63)")
    offset = int(dropout_offset)
    if not 0 <= offset < 2**32:
        raise ValueError("dropout_offset must lie in [0, 2^32)")
    alibi = None
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor):
            raise TypeError("alibi_slopes must be a tensor, (nheads,) or (batch, nheads)")
        alibi = alibi_slopes.detach().to(_f32).contiguous()
    # (flashattn Options, the slopes); causal as one code: both alignments are the same here
    return _core.Options(scale=_core.scale_of(scale), softcap=softcap,
                         causal=_core.CAUSAL_TOP_LEFT if causal else _core.CAUSAL_NONE, window_left=wl,
                         window_right=wr, dropout_p=p, dropout_seed=seed, dropout_offset=offset), alibi


def _sinks_f32(sinks, what):
    """The sink logits as the core takes them: (nheads,) contiguous f32, detached (the
    autograd functions below carry their gradient); None stays None."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"{what}: sinks must be a tensor (nheads,), got {type(sinks).__name__}")
    return sinks.detach().to(_f32).contiguous()


def _check_local(q, k, v, opts, what, sinks=None):
    """This rank's verdict on its own arguments; the core's validation is run by a
    zero-row forward call, so every rule it owns (dtypes, head ratios, dims,
    scalars, ALiBi shapes, the sinks' length and values) is its own."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise ValueError(f"{what}: {name} is on {t.device}; flashattn runs on CPU tensors only")
        if t.dim() != 4:
            raise ValueError(f"{what}: {name} must be 4-d (batch, seqlen_local, nheads, headdim), "
                             f"got shape {tuple(t.shape)}")
    if not q.shape[1] == k.shape[1] == v.shape[1]:
        raise ValueError(f"{what}: q, k and v must be this rank's rows of one sequence (the same seqlen_local), "
                         f"got {q.shape[1]}, {k.shape[1]}, {v.shape[1]}")
    opts, alibi = opts
    B, Hq = q.shape[0], q.shape[2]
    o0 = torch.empty(B, 0, Hq, v.shape[3], dtype=q.dtype)
    l0 = torch.empty(B, Hq, 0, dtype=_f32)
    _C.forward(_core.current_context(), _dl(q[:, :0]), _dl(k[:, :0]), _dl(v[:, :0]), _dl(o0), _dl(l0), opts=opts,
               alibi_slopes=_dl(alibi), sinks=_dl(_sinks_f32(sinks, what)))


def _agree(group, what, q, k, v, opts, layout, ulysses=False, sinks=None):
    """The local verdict, then one all_gather of (error, descriptor) per rank: every
    rank raises the lowest failing rank's exception, or a disagreement, or returns
    the same plan. Nothing else has moved yet."""
    P = dist.get_world_size(group)
    err, desc = None, None
    try:
        if isinstance(opts, Exception):  # an option this rank refused: still agreed on
            raise opts
        if layout not in LAYOUTS:
            raise ValueError(f"{what}: layout must be one of {LAYOUTS}, got {layout!r}")
        _check_local(q, k, v, opts, what, sinks)
        B, S, Hq, D = q.shape
        Hk, Dv = k.shape[2], v.shape[3]
        if layout == "zigzag" and S % 2:
            raise ValueError(f"{what}: the zig-zag layout needs an even seqlen_local, got {S}")
        if ulysses:
            if Hq % P or Hk % P:
                raise ValueError(f"{what}: Ulysses splits the heads across the {P} ranks: nheads {Hq} and "
                                 f"nheads_k {Hk} must both be multiples of {P}")
            if opts[0].dropout_p > 0:
                raise NotImplementedError(f"{what}: dropout is not supported by Ulysses attention (the dropout "
                                          "counter numbers the heads within a call, and Ulysses splits them); "
                                          "use ring_attention")
        o, alibi = opts
        causal = o.causal != _core.CAUSAL_NONE
        wl, wr, scale, softcap, p, seed, offset = (o.window_left, o.window_right, o.scale, o.softcap, o.dropout_p,
                                                   o.dropout_seed, o.dropout_offset)
        shared = {"batch": B, "nheads": Hq, "nheads_k": Hk, "headdim": D, "headdim_v": Dv,
                  "dtype": str(q.dtype), "causal": causal, "window": (wl, wr), "scale": scale, "softcap": softcap,
                  "alibi_slopes": None if alibi is None else tuple(alibi.flatten().tolist()), "dropout_p": p,
                  "dropout_offset": offset, "layout": layout,
                  "sinks": None if sinks is None else tuple(_sinks_f32(sinks, what).tolist()),
                  "requires_grad": torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)),
                  # a gradient of the sinks makes a collective in the backward
                  "sinks_grad": torch.is_grad_enabled() and sinks is not None and sinks.requires_grad}
        desc = (S, seed, shared)
    except Exception as e:  # noqa: BLE001 - every rank must hear of it, whatever it is
        err = (type(e) if isinstance(e, (ValueError, TypeError, RuntimeError, MemoryError)) else RuntimeError,
               str(e))
    gathered = [None] * P
    dist.all_gather_object(gathered, (err, desc), group=group)
    for x, (e, _) in enumerate(gathered):
        if e is not None:  # the same words on every rank
            msg = e[1] if e[1].startswith(what + ": ") else f"{what}: {e[1]}"
            raise e[0](f"rank {x} of {P}: {msg}")
    ref = gathered[0][1][2]
    for x in range(1, P):
        other = gathered[x][1][2]
        for key in ref:
            if other[key] != ref[key]:
                raise ValueError(f"{what}: ranks 0 and {x} of the group disagree on {key} "
                                 f"({ref[key]!r} vs {other[key]!r})")
    plan = _Plan()
    plan.group, plan.P, plan.rank = group, P, dist.get_rank(group)
    plan.lengths = [g[1][0] for g in gathered]
    plan.layout = layout
    o, plan.alibi = opts
    plan.causal = o.causal != _core.CAUSAL_NONE
    plan.wl, plan.wr, plan.scale, plan.softcap, plan.p, plan.offset = (o.window_left, o.window_right, o.scale,
                                                                       o.softcap, o.dropout_p, o.dropout_offset)
    plan.seed = gathered[0][1][1]  # rank 0's draw, so that every rank drops the same pairs
    plan.opts = o._replace(dropout_seed=plan.seed)
    plan.band_offsets = plan.wl >= 0 or plan.wr >= 0 or plan.alibi is not None
    if plan.band_offsets and plan.p > 0 and len(set(plan.lengths)) > 1:
        raise NotImplementedError(f"{what}: a window or ALiBi with dropout needs equal shard lengths (the core's band "
                                  "rules and its dropout counter need different offsets unless every call has "
                                  f"Sq = Sk); got {plan.lengths}")
    plan.sinks = _sinks_f32(sinks, what)
    plan.sinks_grad = ref["sinks_grad"]
    plan.ctx = _core.current_context()
    plan.peers = [dist.get_global_rank(group, x) if group is not None else x for x in range(P)]
    plan.steps = None if ulysses else _ring_plan(layout, plan.lengths, plan.rank, plan.causal, plan.wl, plan.wr,
                                                 plan.alibi is not None, plan.p)["steps"]
    return plan


# ------------------------------------------------------------------ the ring


def _halves(plan, pieces):
    """The pieces cut by query rows into a first and a second half of their kept pairs
    (the own step of the backward: one half hides the first k/v transfer, the other
    the dK/dV accumulators' way home), each half placed and counted by the library.
    Not with dropout and a window or ALiBi, whose calls must keep Sq = Sk."""
    if plan.p > 0 and plan.band_offsets:
        return pieces, []
    parts, spans = [], []
    for pc in pieces:
        q_row, n, k_row, m, q_pos, k_pos = pc[:6]
        h = n // 2
        for a, b in ((0, h), (h, n)):
            if b > a:
                parts.append((q_row + a, k_row, pc[10]))
                spans.append((q_pos + a, b - a, k_pos, m))
    placed = _ring_plan(plan.layout, plan.lengths, plan.rank, plan.causal, plan.wl, plan.wr, plan.alibi is not None,
                        plan.p, blocks=spans)["blocks"]
    halves = [(q_row, pl[1], k_row) + pl[3:10] + (diagonal,) for (q_row, k_row, diagonal), pl in zip(parts, placed)]
    weights = [pc[9] for pc in halves]
    total, run, cut = sum(weights), 0, 0
    while cut < len(halves) and 2 * (run + weights[cut]) <= total:
        run += weights[cut]
        cut += 1
    return halves[:cut], halves[cut:]


def _kv_buffers(plan, k, v, per_row):
    """The two travelling k/v buffers, each for the longest shard; the first holds
    this rank's k then v, contiguous."""
    top = per_row * max(plan.lengths)
    bufs = [torch.empty(top, dtype=k.dtype), torch.empty(top, dtype=k.dtype) if plan.P > 1 else None]
    nk = k.numel()
    bufs[0][:nk].view(k.shape).copy_(k)
    bufs[0][nk:nk + v.numel()].view(v.shape).copy_(v)
    return bufs


def _kv_of(buf, plan, src, B, Hk, D, Dv):
    """The (k, v) views, or (dK, dV), of a buffer holding rank src's shard."""
    S = plan.lengths[src]
    nk = B * S * Hk * D
    return buf[:nk].view(B, S, Hk, D), buf[nk:nk + B * S * Hk * Dv].view(B, S, Hk, Dv)


_TAG_KV, _TAG_ACC = 1, 2


class _Transfers:
    """Posted isend/irecv on the group; wait() returns the seconds spent waiting.
    k/v shards and dK/dV accumulators between the same two ranks are in flight at
    once, in different orders on the two sides: each kind has its own tag."""

    def __init__(self, tag):
        self.works = []
        self.tag = tag

    def send(self, plan, t, to):
        self.works.append(dist.isend(t, plan.peers[to], group=plan.group, tag=self.tag))

    def recv(self, plan, t, frm):
        self.works.append(dist.irecv(t, plan.peers[frm], group=plan.group, tag=self.tag))

    def pass_kv(self, plan, bufs, s, per_row):
        """Step s of the ring: receives the next step's k/v shard (rank r - s - 1's)
        from rank r - 1 and sends the one at hand (rank r - s's) to rank r + 1;
        returns the bytes sent."""
        P, r = plan.P, plan.rank
        if s >= P - 1:
            return 0
        n = per_row * plan.lengths[(r - s) % P]
        self.recv(plan, bufs[(s + 1) % 2][:per_row * plan.lengths[(r - s - 1) % P]], (r - 1) % P)
        self.send(plan, bufs[s % 2][:n], (r + 1) % P)
        return n * bufs[0].element_size()

    def wait(self):
        t0 = time.perf_counter()
        for w in self.works:
            w.wait()
        self.works = []
        return time.perf_counter() - t0


def _fwd_call(plan, q, kt, vt, pc, o, lse):
    qo, n, ko, m, _, _, qs, ks, causal = pc[:9]
    _C.forward(plan.ctx, _dl(q[:, qo:qo + n]), _dl(kt[:, ko:ko + m]), _dl(vt[:, ko:ko + m]), _dl(o[:, qo:qo + n]),
               _dl(lse[:, :, qo:qo + n]), opts=plan.opts._replace(causal=causal, q_start=qs, k_start=ks),
               alibi_slopes=_dl(plan.alibi))


def _ring_forward(plan, q, k, v):
    """(o in q's dtype, lse f32 (B, Hq, S_r)): P steps; at step s this rank holds the
    k/v of rank r - s, posts the next shard's irecv and its own isend, computes, and
    merges the step's partial (o, lse) into f32 accumulators."""
    t_start = time.perf_counter()
    P, r = plan.P, plan.rank
    B, S, Hq, D = q.shape
    Hk, Dv = k.shape[2], v.shape[3]
    per_row = B * Hk * (D + Dv)
    bufs = _kv_buffers(plan, k, v, per_row)
    acc_o = torch.zeros(B, S, Hq, Dv, dtype=_f32)
    acc_l = torch.full((B, Hq, S), float("-inf"), dtype=_f32)
    part_o = torch.empty(B, S, Hq, Dv, dtype=_f32)
    part_l = torch.empty(B, Hq, S, dtype=_f32)
    x = _Transfers(_TAG_KV)
    compute = exposed = 0.0
    sent = 0
    for s in range(P):
        src = (r - s) % P
        cur = bufs[s % 2]
        sent += x.pass_kv(plan, bufs, s, per_row)
        kt, vt = _kv_of(cur, plan, src, B, Hk, D, Dv)
        t0 = time.perf_counter()
        for pc in plan.steps[s]:
            qo, n = pc[0], pc[1]
            _fwd_call(plan, q, kt, vt, pc, part_o, part_l)
            ao, al = acc_o[:, qo:qo + n], acc_l[:, :, qo:qo + n]
            _C.merge_states(plan.ctx, [_dl(ao), _dl(part_o[:, qo:qo + n])], [_dl(al), _dl(part_l[:, :, qo:qo + n])],
                            _dl(ao), _dl(al))
        compute += time.perf_counter() - t0
        exposed += x.wait()
    o = torch.empty(B, S, Hq, Dv, dtype=q.dtype)
    if plan.sinks is None:
        # one exact merge of one part: rounds o once to its dtype
        _C.merge_states(plan.ctx, [_dl(acc_o)], [_dl(acc_l)], _dl(o), None)
    else:
        # the blocks ran without sinks; the sink rule (docs/semantics.md, step 6) is one
        # more part of every row, no value and lse = the head's sink, merged once here
        sink_o = torch.zeros_like(acc_o)
        sink_l = plan.sinks.view(1, Hq, 1).expand(B, Hq, S).contiguous()
        lse = torch.empty_like(acc_l)
        _C.merge_states(plan.ctx, [_dl(acc_o), _dl(sink_o)], [_dl(acc_l), _dl(sink_l)], _dl(o), _dl(lse))
        acc_l = lse
    _record("ring_forward", total=time.perf_counter() - t_start, compute=compute, exposed=exposed, bytes_sent=sent)
    return o, acc_l


def _bwd_calls(plan, pieces, q, kt, vt, o, lse, dout, dq_acc, dkv, dsinks_acc=None):
    """Runs fa_backward on each block with the forward's global o and lse of its rows,
    so P and dot(dO, o) are the whole sequence's and the block's gradients are exactly
    its terms of the full sums: dq adds into dq_acc, dk and dv into dkv's (k, v) rows.
    dsinks_acc (the own step's pieces only): each local row's sink term once, from the
    planner's diagonal pieces (the band keeps every row's diagonal), added in f64 in
    piece order, as mpi/ring.c does."""
    B, Hq, D = q.shape[0], q.shape[2], q.shape[3]
    dk_acc, dv_acc = dkv
    ds = torch.empty(Hq, dtype=_f32) if dsinks_acc is not None else None
    for qo, n, ko, m, _, _, qs, ks, causal, _, diagonal in pieces:
        dq = torch.empty(B, n, Hq, D, dtype=_f32)
        dk = torch.empty(B, m, kt.shape[2], kt.shape[3], dtype=_f32)
        dv = torch.empty(B, m, vt.shape[2], vt.shape[3], dtype=_f32)
        sink_rows = ds is not None and diagonal
        _C.backward(plan.ctx, _dl(q[:, qo:qo + n]), _dl(kt[:, ko:ko + m]), _dl(vt[:, ko:ko + m]),
                    _dl(o[:, qo:qo + n]), _dl(lse[:, :, qo:qo + n]),
                    opts=plan.opts._replace(causal=causal, q_start=qs, k_start=ks), dout=_dl(dout[:, qo:qo + n]),
                    dq=_dl(dq), dk=_dl(dk), dv=_dl(dv), alibi_slopes=_dl(plan.alibi), sinks=_dl(plan.sinks),
                    dsinks=_dl(ds) if sink_rows else None)
        if sink_rows:
            dsinks_acc += ds.double()
        dq_acc[:, qo:qo + n] += dq
        dk_acc[:, ko:ko + m] += dk
        dv_acc[:, ko:ko + m] += dv


def _ring_backward(plan, dout, q, k, v, o, lse, want_dsinks=False):
    """(dq, dk, dv, dsinks or None): the k/v shards go round the ring again; at step s >= 1 this rank
    adds its terms for the visiting shard into that shard's f32 dK/dV accumulator,
    received from the rank before (which held the shard one step earlier), and sends
    it on; after step P - 1 it reaches its owner, which adds its own terms, computed
    half at step 0 and half while the accumulator makes that last hop."""
    t_start = time.perf_counter()
    P, r = plan.P, plan.rank
    B, S, Hq, D = q.shape
    Hk, Dv = k.shape[2], v.shape[3]
    per_row = B * Hk * (D + Dv)
    top = per_row * max(plan.lengths)
    bufs = _kv_buffers(plan, k, v, per_row)
    accs = [torch.empty(top, dtype=_f32), torch.empty(top, dtype=_f32)] if P > 1 else []
    own = torch.zeros(per_row * S, dtype=_f32)
    dq_acc = torch.zeros(B, S, Hq, D, dtype=_f32)
    dout = dout if dout.dtype in (q.dtype, _f32) else dout.to(q.dtype)
    xkv, xin, xout = _Transfers(_TAG_KV), _Transfers(_TAG_ACC), _Transfers(_TAG_ACC)
    compute = exposed = 0.0
    sent = 0
    late = []
    dsinks = torch.zeros(Hq, dtype=torch.float64) if want_dsinks else None
    for s in range(P):
        src = (r - s) % P
        cur = bufs[s % 2]
        sent += xkv.pass_kv(plan, bufs, s, per_row)
        n_acc = per_row * plan.lengths[src]
        acc = accs[s % 2][:n_acc] if s > 0 else None
        if s >= 2:  # the accumulator of src, from the rank that held src last step
            xin.recv(plan, acc, (r - 1) % P)
        kt, vt = _kv_of(cur, plan, src, B, Hk, D, Dv)
        t0 = time.perf_counter()
        blocks = plan.steps[s]
        if s == 0:
            blocks, late = _halves(plan, blocks) if P > 1 else (blocks, [])
            _bwd_calls(plan, blocks, q, kt, vt, o, lse, dout, dq_acc, _kv_of(own, plan, r, B, Hk, D, Dv), dsinks)
        else:
            terms = torch.zeros(n_acc, dtype=_f32)
            _bwd_calls(plan, blocks, q, kt, vt, o, lse, dout, dq_acc, _kv_of(terms, plan, src, B, Hk, D, Dv))
        compute += time.perf_counter() - t0
        if s > 0:
            exposed += xin.wait()
            t1 = time.perf_counter()
            if s >= 2:
                acc += terms
            else:
                acc.copy_(terms)
            compute += time.perf_counter() - t1
            exposed += xout.wait()  # the last send, before its buffer is received into
            xout.send(plan, acc, (r + 1) % P)
            sent += n_acc * 4
        exposed += xkv.wait()
    if P > 1:  # this rank's own accumulator comes home while the own step's second half runs
        mine = accs[P % 2][:per_row * S]
        xin.recv(plan, mine, (r - 1) % P)
        t0 = time.perf_counter()
        _bwd_calls(plan, late, q, k, v, o, lse, dout, dq_acc, _kv_of(own, plan, r, B, Hk, D, Dv), dsinks)
        compute += time.perf_counter() - t0
        exposed += xin.wait() + xout.wait()
        own += mine
    dk, dv = _kv_of(own, plan, r, B, Hk, D, Dv)
    if dsinks is not None:  # every rank's partial, summed in rank order: the same bits on every rank
        parts = [torch.empty_like(dsinks) for _ in range(P)]
        dist.all_gather(parts, dsinks, group=plan.group)
        dsinks = torch.zeros_like(dsinks)
        for x in parts:
            dsinks += x
        dsinks = dsinks.to(_f32)
    _record("ring_backward", total=time.perf_counter() - t_start, compute=compute, exposed=exposed, bytes_sent=sent)
    return dq_acc.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsinks


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, plan):
        o, lse = _ring_forward(plan, q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.plan = plan
        ctx.sinks_dtype = None if sinks is None else sinks.dtype
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        # the agreed flag, not this rank's needs_input_grad: the dsinks sum is a collective
        want = ctx.sinks_dtype is not None and ctx.plan.sinks_grad
        dq, dk, dv, dsinks = _ring_backward(ctx.plan, dout, q, k, v, o, lse, want)
        return dq, dk, dv, None if dsinks is None else dsinks.to(ctx.sinks_dtype), None


def ring_attention(q, k, v, *, group=None, causal=False, window=None, softcap=0.0, alibi_slopes=None, dropout_p=0.0,
                   scale=None, layout="zigzag", dropout_seed=None, dropout_offset=0, return_lse=False, sinks=None):
    """Exact attention over a sequence sharded across the ranks of `group` (default:
    the world), by ring attention.

    q (B, S_r, Hq, D), k, v (B, S_r, Hk, D[v]): this rank's rows in `layout`
    ("zigzag": chunks r and 2P-1-r of 2P, S_r even, balanced causal work; or
    "contiguous": rows after those of ranks 0..r-1). Shard lengths may differ between
    ranks. Returns this rank's rows of the output (B, S_r, Hq, Dv) in q's dtype,
    differentiable (the backward is a ring as well), and with return_lse also the
    rows' lse (B, Hq, S_r) fp32.

    Options as flash_attn_func over the whole sequence: causal, window (left, right)
    or None, softcap, alibi_slopes, dropout_p (the mask of one process's call: it is
    drawn at global positions, from rank 0's dropout_seed), scale, and sinks (nheads,),
    gpt-oss's attention sinks, the same values on every rank (the blocks run without
    them and the sink enters each row's final merge once; with requires_grad every
    rank gets the whole sequence's gradient, the same bits on each). A collective:
    every rank of the group calls it, forward and backward, in the same order. Bad
    arguments on any rank raise the same exception on every rank before any data
    moves. Bitwise reproducible for a fixed group size, layout and shard lengths.
    """
    try:
        opts = _options(causal, window, softcap, alibi_slopes, dropout_p, scale, layout, dropout_seed,
                        dropout_offset)
    except Exception as e:  # noqa: BLE001 - agreed on with the other ranks
        opts = e
    plan = _agree(group, "ring_attention", q, k, v, opts, layout, sinks=sinks)
    o, lse = _Ring.apply(q, k, v, sinks, plan)
    return (o, lse) if return_lse else o


# ------------------------------------------------------------------ Ulysses


def _order(plan):
    """The global positions of the rows of all shards concatenated in rank order."""
    return torch.cat([positions(sum(plan.lengths), layout=plan.layout, lengths=plan.lengths, rank=x,
                                world_size=plan.P) for x in range(plan.P)])


def _seq_to_heads(plan, x):
    """(B, S_r, H, X) shards -> (B, N, H/P, X): the whole sequence in global order, this
    rank's group of heads."""
    P = plan.P
    B, S, H, X = x.shape
    h = H // P
    send = x.reshape(B, S, P, h, X).permute(2, 0, 1, 3, 4).contiguous().reshape(-1)
    sizes = [B * s * h * X for s in plan.lengths]
    recv = torch.empty(sum(sizes), dtype=x.dtype)
    dist.all_to_all_single(recv, send, output_split_sizes=sizes, input_split_sizes=[B * S * h * X] * P,
                           group=plan.group)
    parts = [p.view(B, s, h, X) for p, s in zip(recv.split(sizes), plan.lengths)]
    full = torch.cat(parts, dim=1)
    if plan.layout == "contiguous":
        return full
    out = torch.empty_like(full)
    out[:, _order(plan)] = full
    return out


def _heads_to_seq(plan, y):
    """The inverse of _seq_to_heads: (B, N, H/P, X) -> (B, S_r, H, X)."""
    P, r = plan.P, plan.rank
    B, N, h, X = y.shape
    if plan.layout == "zigzag":
        y = y[:, _order(plan)]
    send = torch.cat([p.reshape(-1) for p in y.split(plan.lengths, dim=1)])
    S = plan.lengths[r]
    recv = torch.empty(P * B * S * h * X, dtype=y.dtype)
    dist.all_to_all_single(recv, send, output_split_sizes=[B * S * h * X] * P,
                           input_split_sizes=[B * s * h * X for s in plan.lengths], group=plan.group)
    return recv.view(P, B, S, h, X).permute(1, 2, 0, 3, 4).reshape(B, S, P * h, X)


def _rank_heads(x, plan):
    """This rank's group of heads along x's last axis (Ulysses: rank r holds heads
    r * H/P .. (r + 1) * H/P - 1)."""
    h = x.shape[-1] // plan.P
    return x[..., plan.rank * h:(plan.rank + 1) * h]


class _HeadSlice(torch.autograd.Function):
    """This rank's heads of the sinks (nheads,), for its Ulysses call; the gradient
    comes back whole: each rank's slice of it, gathered (no head is summed twice, so
    every rank holds the same bits)."""

    @staticmethod
    def forward(ctx, sinks, plan):
        ctx.plan = plan
        return _rank_heads(sinks, plan).clone()

    @staticmethod
    def backward(ctx, g):
        parts = [torch.empty_like(g) for _ in range(ctx.plan.P)]
        dist.all_gather(parts, g.contiguous(), group=ctx.plan.group)
        return torch.cat(parts), None


class _AllToAll(torch.autograd.Function):
    """_seq_to_heads (to_heads) or _heads_to_seq; the gradient goes the other way."""

    @staticmethod
    def forward(ctx, x, plan, to_heads):
        ctx.plan, ctx.to_heads = plan, to_heads
        return (_seq_to_heads if to_heads else _heads_to_seq)(plan, x)

    @staticmethod
    def backward(ctx, g):
        return (_heads_to_seq if ctx.to_heads else _seq_to_heads)(ctx.plan, g.contiguous()), None, None


def ulysses_attention(q, k, v, *, group=None, causal=False, window=None, softcap=0.0, alibi_slopes=None,
                      dropout_p=0.0, scale=None, layout="zigzag", dropout_seed=None, dropout_offset=0, sinks=None):
    """Exact attention over a sequence sharded across the ranks of `group`, by Ulysses
    (DeepSpeed-Ulysses) context parallelism: an all-to-all gives every rank the whole
    sequence for nheads / P of the heads, one flashattn call runs there, and an
    all-to-all brings the output back to (B, S_r, Hq, Dv) shards.

    Arguments and results as ring_attention (sinks included: each rank's call takes
    its heads' sinks, and their gradient is gathered whole on every rank); nheads and
    nheads_k must be multiples of the group size, and dropout is refused (the core's
    dropout counter numbers the heads within a call). Differentiable; every rank calls
    it, in the same order.
    """
    try:
        opts = _options(causal, window, softcap, alibi_slopes, dropout_p, scale, layout, dropout_seed,
                        dropout_offset)
    except Exception as e:  # noqa: BLE001 - agreed on with the other ranks
        opts = e
    plan = _agree(group, "ulysses_attention", q, k, v, opts, layout, ulysses=True, sinks=sinks)
    t0 = time.perf_counter()
    qh, kh, vh = (_AllToAll.apply(t, plan, True) for t in (q, k, v))
    alibi = plan.alibi
    if alibi is not None:
        alibi = _rank_heads(alibi, plan).contiguous()
    hs = None
    if sinks is not None:
        # the agreed flag decides whether the backward gathers (a collective), not this rank's graph
        hs = _HeadSlice.apply(sinks, plan) if plan.sinks_grad else _rank_heads(sinks.detach(), plan)
        hs = hs.to(_f32)
    t1 = time.perf_counter()
    opts = plan.opts._replace(causal=_core.CAUSAL_BOTTOM_RIGHT if plan.causal else _core.CAUSAL_NONE, dropout_p=0.0,
                              dropout_seed=0, dropout_offset=0)
    oh, _, _ = _attention(qh, kh, vh, None, None, alibi, None, None, opts, False, need_lse=False, sinks=hs)
    t2 = time.perf_counter()
    o = _AllToAll.apply(oh, plan, False)
    t3 = time.perf_counter()
    _record("ulysses", total=t3 - t0, compute=t2 - t1, exposed=(t1 - t0) + (t3 - t2), bytes_sent=0)
    return o
