"""test_distributed.py: flashattn.torch.distributed across 2, 3 and 4 processes on this machine.

Each test starts its processes with torch.multiprocessing (spawn), gloo over
loopback (127.0.0.1, a free port), one thread each (torch and the flashattn
context), and gives them a deadline: a rank that has not answered by then fails
the test as a hang, and every process still alive is killed.

Inside the processes every case runs the sharded call and judges this rank's rows
of the output and of dq, dk, dv by the accuracy rule of docs/semantics.md
(conftest.assert_rule: the float64 formula on the whole sequence is the oracle,
the same formula in the input dtype the naive bound); dropout is judged against
one process's flash_attn_func on the whole sequence with the same seed (the same
mask, so the results agree to rounding). Coverage: ring (zig-zag, contiguous) and
Ulysses; f32, bf16; causal and not; windows; ALiBi; GQA; unequal shard lengths;
bitwise reproducibility; errors raised alike on every rank (bad shapes on one rank,
disagreeing ranks, heads not divisible for Ulysses); the Llama training step of
bench/python/cp_llama.py against one process.
"""

import importlib.util
import os
import pathlib
import queue as queue_mod
import socket
import time
import traceback
from datetime import timedelta

import pytest

from conftest import assert_rule, attn_ref, needs_torch, rule_tol, sink_ref, torch

pytestmark = needs_torch

REPO = pathlib.Path(__file__).resolve().parents[2]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, fn, args, results):
    import torch.distributed as dist

    import flashattn

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
        with flashattn.Context(threads=1):
            out = fn(rank, world, *args)
        results.put((rank, "ok", out))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(world, fn, *args, timeout=90):
    """fn(rank, world, *args) on `world` processes; their results in rank order."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, results), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                r, status, payload = results.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                if all(not p.is_alive() for p in procs) and results.empty():
                    break
                continue
            got[r] = (status, payload)
    finally:
        for p in procs:
            p.join(timeout=5 if len(got) == world else 0.1)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    missing = [r for r in range(world) if r not in got]
    assert not missing, f"ranks {missing} of {world} gave no result within {timeout} s (a hang, or a crash)"
    errors = [f"rank {r}: {got[r][1]}" for r in range(world) if got[r][0] != "ok"]
    assert not errors, "\n".join(errors)
    return [got[r][1] for r in range(world)]


# ------------------------------------------------------------------ the cases


def _full(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _case(rank, world, method="ring", layout="zigzag", dtype=torch.float32, causal=False, window=None, gqa=False,
          lengths=None, alibi=False, dropout=0.0, repeat=False, B=1, D=16, sinks=False):
    import flashattn
    import flashattn.torch.distributed as fd

    Hq = 2 * world
    Hk = world if gqa else Hq
    lengths = lengths or [16] * world
    N = sum(lengths)
    q, k, v, do = (_full(s, dtype, seed) for s, seed in (((B, N, Hq, D), 1), ((B, N, Hk, D), 2), ((B, N, Hk, D), 3),
                                                         ((B, N, Hq, D), 4)))
    slopes = torch.linspace(0.05, 0.4, Hq, dtype=torch.float32) if alibi else None

    def mine(x):
        return fd.shard(x, layout=layout, lengths=lengths).detach().requires_grad_(x is not do)

    ql, kl, vl, dol = (mine(x) for x in (q, k, v, do))
    call = fd.ring_attention if method == "ring" else fd.ulysses_attention
    kw = dict(causal=causal, window=window, alibi_slopes=slopes, layout=layout)
    sk = None
    if sinks:  # one head's sink at -inf: no term, and a zero gradient
        vals = _full((Hq,), torch.float32, 5) * 2.0
        vals[0] = float("-inf")
        sk = vals.requires_grad_()
        kw["sinks"] = sk
    if dropout:
        kw.update(dropout_p=dropout, dropout_seed=1234, dropout_offset=7)
    o = call(ql, kl, vl, **kw)
    o.backward(dol)
    got = {"out": o.detach(), "dq": ql.grad, "dk": kl.grad, "dv": vl.grad}
    if sinks:
        got["dsinks"] = sk.grad.clone()
        assert got["dsinks"][0] == 0, "a -inf sink has a zero gradient"
        every = [torch.empty_like(sk.grad) for _ in range(world)]
        torch.distributed.all_gather(every, sk.grad)
        assert all(torch.equal(x, every[0]) for x in every), "the ranks' dsinks differ"
    if repeat:
        ql2, kl2, vl2 = (x.detach().clone().requires_grad_() for x in (ql, kl, vl))
        if sinks:
            kw["sinks"] = sk2 = sk.detach().clone().requires_grad_()
        o2 = call(ql2, kl2, vl2, **kw)
        o2.backward(dol)
        again = [("out", o2.detach(), got["out"]), ("dq", ql2.grad, got["dq"]), ("dk", kl2.grad, got["dk"]),
                 ("dv", vl2.grad, got["dv"])] + ([("dsinks", sk2.grad, got["dsinks"])] if sinks else [])
        for name, a, b in again:
            assert torch.equal(a, b), f"{name} differs between two identical calls"

    def ours(x):
        return fd.shard(x, layout=layout, lengths=lengths)

    if dropout:  # one process with the same seed: the same mask
        qf, kf, vf = (x.detach().clone().requires_grad_() for x in (q, k, v))
        of = flashattn.flash_attn_func(qf, kf, vf, dropout_p=dropout, causal=causal,
                                       window_size=window or (-1, -1), alibi_slopes=slopes, dropout_seed=1234,
                                       dropout_offset=7)
        of.backward(do)
        for name, ref in (("out", of), ("dq", qf.grad), ("dk", kf.grad), ("dv", vf.grad)):
            ref = ours(ref.detach())
            err = (got[name].double() - ref.double()).abs().max().item()
            assert err <= 1e-5 * max(1.0, ref.abs().max().item()), f"{name}: {err:.3g} from one process's dropout"
        return
    cz = "top-left" if causal else None
    win = window or (-1, -1)
    refs = {}
    for prec in (torch.float64, dtype):
        qf, kf, vf = (x.detach().to(prec).requires_grad_() for x in (q, k, v))
        if sinks:  # one sequence: bottom-right causal is top-left
            sf = sk.detach().to(torch.float64 if prec == torch.float64 else torch.float32).requires_grad_()
            of, lse = sink_ref(qf, kf, vf, sf, causal=causal, window=win, dtype=prec)
        else:
            of, _ = attn_ref(qf, kf, vf, causal=cz, window=win, alibi=slopes, dtype=prec)
        of.backward(do.to(prec))
        refs[prec] = {"out": of.detach(), "dq": qf.grad, "dk": kf.grad, "dv": vf.grad}
        if sinks:
            refs[prec]["dsinks"] = sf.grad
            refs[prec]["lse"] = lse.detach()
    for name in ("out", "dq", "dk", "dv"):
        assert_rule(got[name], ours(refs[torch.float64][name]), ours(refs[dtype][name]), what=f"rank {rank} {name}")
    if sinks:  # the whole sequence's gradient on every rank
        r64 = refs[torch.float64]
        # the rule, plus what rounding o to the dtype adds: dsinks_h sums
        # exp(sink_h - lse_i) dot(dO_i, o_i) with the output's o, each term off by
        # at most u sum_e |dO_ie o_ie| (u the dtype's unit roundoff; 0 for f32, whose o
        # the naive formula rounds alike)
        u = 0.0 if dtype == torch.float32 else torch.finfo(dtype).eps / 2
        w = torch.exp(sk.detach().double()[None, :, None] - r64["lse"])
        slack = u * (w * (do.double().abs() * r64["out"].abs()).sum(-1).transpose(1, 2)).sum((0, 2))
        err = (got["dsinks"][1:].double() - r64["dsinks"][1:]).abs().max().item()
        tol = rule_tol(r64["dsinks"][1:], refs[dtype]["dsinks"][1:], torch.float32, 4) + slack[1:].max().item()
        assert err <= tol, f"rank {rank} dsinks: max error {err:.3g} > tolerance {tol:.3g}"


def _run_cases(rank, world, cases):
    failures = []
    for c in cases:
        try:
            _case(rank, world, **c)
        except AssertionError as e:
            failures.append(f"{c}: {e}")
    return failures


def _cases_for(world):
    """Every form at 2 processes; at 3 and 4 one case of each method and layout, with
    unequal shard lengths, windows, GQA and bf16 spread over them."""
    bf16 = torch.bfloat16
    uneven = [8 + 4 * r for r in range(world)]
    if world > 2:
        return [dict(method="ring", causal=True, gqa=True, lengths=uneven),
                dict(method="ring", causal=True, sinks=True),
                dict(method="ulysses", layout="contiguous", causal=True, gqa=True, sinks=True),
                dict(method="ring", layout="contiguous", causal=True, window=(5, 0), dtype=bf16),
                dict(method="ulysses", causal=True, gqa=True),
                dict(method="ulysses", layout="contiguous", window=(3, 6), lengths=uneven)]
    cases = []
    for layout in ("zigzag", "contiguous"):
        for method in ("ring", "ulysses"):
            cases += [dict(method=method, layout=layout),
                      dict(method=method, layout=layout, causal=True, gqa=True),
                      dict(method=method, layout=layout, dtype=bf16, causal=True),
                      dict(method=method, layout=layout, causal=True, window=(5, 0), lengths=uneven)]
        cases += [dict(method="ring", layout=layout, window=(3, 6), alibi=True)]
    cases += [dict(method="ring", dtype=bf16, gqa=True),
              dict(method="ring", layout="contiguous", lengths=[6, 20], causal=True, gqa=True),
              dict(method="ring", causal=True, dropout=0.2),
              dict(method="ring", layout="contiguous", causal=True, window=(6, 0), alibi=True, dropout=0.3),
              dict(method="ring", causal=True, repeat=True),
              dict(method="ulysses", causal=True, repeat=True, B=2),
              dict(method="ring", causal=True, gqa=True, sinks=True, B=2),
              dict(method="ring", layout="contiguous", window=(5, 0), lengths=uneven, sinks=True),
              dict(method="ring", dtype=bf16, sinks=True),
              dict(method="ring", causal=True, sinks=True, repeat=True),
              dict(method="ulysses", causal=True, gqa=True, sinks=True),
              dict(method="ulysses", layout="contiguous", dtype=bf16, window=(3, 6), sinks=True)]
    return cases


@pytest.mark.parametrize("world", [2, 3, 4])
def test_against_one_process(world):
    failures = spawn(world, _run_cases, _cases_for(world), timeout=150)
    bad = [f"rank {r}: {f}" for r, fs in enumerate(failures) for f in fs]
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------ the planner


def _global_keeps(causal, wl, wr, i, j):
    return not (causal and j > i) and not (wl >= 0 and i - j > wl) and not (wr >= 0 and j - i > wr)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, (3, 0)), (False, (2, 5))])
def test_ring_plan_covers_the_band(layout, causal, window):
    """_C.ring_plan, the library's planner as distributed.py asks it: over every rank
    and step, each pair the whole sequence's band keeps is computed once, by a piece
    whose count is its pairs, and the segments place every row once."""
    from flashattn import _C, _core

    wl, wr = window or (-1, -1)
    lengths = [4, 6, 0, 8]
    N, P = sum(lengths), len(lengths)
    hits = {}
    places = []
    for r in range(P):
        plan = _C.ring_plan(_core.current_context(), lengths, r, layout == "zigzag",
                            _core.CAUSAL_TOP_LEFT if causal else _core.CAUSAL_NONE, wl, wr, False, 0.0,
                            whole_shards=True)
        pos = [[p + i for p, m, _ in segs for i in range(m)] for segs in plan["segments"]]
        places += pos[r]
        for s, pieces in enumerate(plan["steps"]):
            src = (r - s) % P
            for q_row, rows, k_row, keys, _, _, _, _, _, kept, _ in pieces:
                pairs = [(pos[r][q_row + i], pos[src][k_row + j]) for i in range(rows) for j in range(keys)
                         if _global_keeps(causal, wl, wr, pos[r][q_row + i], pos[src][k_row + j])]
                assert kept == len(pairs), (r, s, kept, len(pairs))
                for pair in pairs:
                    hits[pair] = hits.get(pair, 0) + 1
    assert sorted(places) == list(range(N))
    want = {(i, j) for i in range(N) for j in range(N) if _global_keeps(causal, wl, wr, i, j)}
    assert set(hits) == want and all(n == 1 for n in hits.values())
    with pytest.raises(ValueError):  # an odd zig-zag shard: the library's refusal
        _C.ring_plan(_core.current_context(), [3, 4], 0, True, 0, -1, -1, False, 0.0)


# ------------------------------------------------------------------ errors


def _errors(rank, world):
    """Each bad call must raise the same exception, with the same words, on every rank;
    then a good call must still work (no rank is left behind in a collective)."""
    import flashattn.torch.distributed as fd

    def attempt(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the verdict is what is compared
            return f"{type(e).__name__}: {e}"
        return "no error"

    S, H, D = 8, 2 * world, 16
    good = [torch.randn(1, S, H, D) for _ in range(3)]
    out = {}
    # k shorter than q on rank 1 only
    bad = [good[0], good[1][:, : S - 2 if rank == 1 else S], good[2]]
    out["seq"] = attempt(lambda: fd.ring_attention(*bad, causal=True))
    # head dims of q and k differ on the last rank only: the core's own validation
    bad = [good[0], torch.randn(1, S, H, D + (8 if rank == world - 1 else 0)), good[2]]
    out["dims"] = attempt(lambda: fd.ring_attention(*bad))
    # ranks disagree on the heads
    bad = [torch.randn(1, S, H + 2 * rank, D) for _ in range(3)]
    out["disagree"] = attempt(lambda: fd.ring_attention(*bad))
    # an odd zig-zag shard on rank 0
    bad = [x[:, : S - 1 if rank == 0 else S] for x in good]
    out["odd"] = attempt(lambda: fd.ring_attention(*bad, layout="zigzag"))
    # heads that do not divide by the group for Ulysses
    bad = [torch.randn(1, S, world + 1, D) for _ in range(3)]
    out["ulysses_heads"] = attempt(lambda: fd.ulysses_attention(*bad))
    # a bad option on one rank
    out["window"] = attempt(lambda: fd.ring_attention(*good, window=(-3, 0) if rank == 1 else None))
    # sinks on one rank only, and a +inf sink (the core's rule)
    one = torch.zeros(H) if rank == 0 else None
    out["sinks_one"] = attempt(lambda: fd.ring_attention(*good, sinks=one))
    out["sinks_inf"] = attempt(lambda: fd.ulysses_attention(*good, sinks=torch.full((H,), float("inf"))))
    out["after"] = attempt(lambda: fd.ring_attention(*good, causal=True).sum().item())
    return out


def test_errors_agree():
    world = 3
    res = spawn(world, _errors, timeout=90)
    for key in res[0]:
        verdicts = {r[key] for r in res}
        assert len(verdicts) == 1, f"{key}: the ranks disagree: {[r[key] for r in res]}"
    assert res[0]["after"] == "no error"
    for key, kind in (("seq", "ValueError"), ("dims", "ValueError"), ("disagree", "ValueError"),
                      ("odd", "ValueError"), ("ulysses_heads", "ValueError"), ("window", "ValueError"),
                      ("sinks_one", "ValueError"), ("sinks_inf", "ValueError")):
        assert res[0][key].startswith(kind), f"{key}: {res[0][key]}"
    assert "multiples of 3" in res[0]["ulysses_heads"]
    assert "rank 1 of 3" in res[0]["seq"] and "rank 2 of 3" in res[0]["dims"]


# ------------------------------------------------------------------ the Llama job


def _llama(rank, world):
    spec = importlib.util.spec_from_file_location("cp_llama", REPO / "bench" / "python" / "cp_llama.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [mod.run(method=method, layout="zigzag", steps=2, seq=64, hidden=64, layers=2, heads=4, kv_heads=2,
                    check=True, verbose=False) for method in ("ring", "ulysses")]


def test_llama_training_step():
    pytest.importorskip("transformers")
    res = spawn(2, _llama, timeout=150)
    for per_rank in res:
        for method, r in zip(("ring", "ulysses"), per_rank):
            assert r["max_loss_diff"] <= 1e-5, (method, r)
            assert r["max_grad_rel"] <= 1e-3, (method, r)
