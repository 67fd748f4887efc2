"""test_tune.py: flashattn.tune, the library's fa_tune from Python.

The tune file goes to a temporary path (FLASHATTN_TUNE_FILE, or path=); the test
reads it back as text in the format README.md documents ("The tune file") and
checks that a new context plans the saved tiles.
"""

import numpy as np
import pytest

import flashattn


def _qkv(seq=256, heads=2, dim=64, seed=3):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, seq, heads, dim)).astype(np.float32) for _ in range(3))


def _entries(path):
    lines = open(path).read().split("\n")
    assert lines[0] == "flashattn-tune 1" and lines[-1] == "", lines
    return [line for line in lines[1:-1] if line and not line.startswith("#")]


def _fields(entry):
    head, cpu = entry.split(" cpu=", 1)
    return dict(kv.split("=", 1) for kv in head.split()), cpu


def test_tune_saves_and_a_new_context_plans_it(tmp_path, monkeypatch):
    path = tmp_path / "tune.txt"
    monkeypatch.setenv("FLASHATTN_TUNE_FILE", str(path))
    q, k, v = _qkv()
    calls = []
    with flashattn.Context(threads=2):
        r = flashattn.tune(q, k, v, tile_qs=[16, 32], tile_kvs=[48], runs=1,
                           progress=lambda *a: calls.append(a))
    assert r["saved"] and r["path"] == str(path), r
    assert [c[:2] for c in calls] == [(1, 3), (2, 3), (3, 3)], calls
    assert r["heuristic"]["asked_q"] == 0 and r["heuristic"]["ms"] > 0, r
    assert r["best"]["ms"] <= r["heuristic"]["ms"], r
    assert 1 <= len(r["timings"]) <= 3 and r["timings"][0] == r["best"], r
    assert r["cpu"] == flashattn.cpu_model()

    entries = _entries(path)
    assert len(entries) == 1, entries
    f, cpu = _fields(entries[0])
    isa = flashattn.Context().isa
    assert cpu == flashattn.cpu_model() and f["isa"] == isa, entries
    assert (f["dtype"], f["d"], f["dv"], f["sk"], f["rows"], f["masked"]) == ("f32", "64", "64", "256", "256", "0")
    tq, tkv = r["saved_tiles"]
    assert (f["tile_q"], f["tile_kv"]) == (str(tq), str(tkv)), (f, r)

    # a new context reads the file at its first planned call and plans the saved tiles
    ctx = flashattn.Context(threads=2)
    with ctx:
        flashattn.flash_attn_func(q, k, v)
    assert (ctx.last()["tile_q"], ctx.last()["tile_kv"]) == (min(tq, 256), min(tkv, 256)), (ctx.last(), r)


def test_tune_keeps_other_entries_and_no_save(tmp_path):
    path = tmp_path / "sub" / "tune.txt"
    q, k, v = _qkv(seq=100, heads=2)
    r = flashattn.tune(q, k, v, causal=True, tile_qs=[16], tile_kvs=[32], runs=1, path=path)
    assert r["saved"] and path.exists(), r
    q2, k2, v2 = _qkv(seq=40, heads=1, dim=16)
    r2 = flashattn.tune(q2, k2, v2, tile_qs=[16], tile_kvs=[32], runs=1, path=path)
    keys = {(f["sk"], f["rows"], f["masked"]) for f, _ in map(_fields, _entries(path))}
    assert keys == {("128", "128", "1"), ("64", "64", "0")}, (keys, r, r2)
    before = path.read_text()
    r3 = flashattn.tune(q2, k2, v2, tile_qs=[16], tile_kvs=[32], runs=1, path=path, save=False)
    assert not r3["saved"] and path.read_text() == before, r3


def test_tune_refuses_a_file_that_is_not_a_tune_file(tmp_path):
    path = tmp_path / "other.txt"
    path.write_text("not a tune file\n")
    q, k, v = _qkv(seq=32, heads=1, dim=16)
    with pytest.raises(OSError, match="not a version 1 tune file"):
        flashattn.tune(q, k, v, runs=1, path=path)
    assert path.read_text() == "not a tune file\n"
    with pytest.raises(ValueError):
        flashattn.tune(q, k, v, tile_qs=[5000], runs=1, save=False)
