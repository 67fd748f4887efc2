#!/usr/bin/env bash
# smoke.sh: a quick end-to-end run of the `flashattn` program: every verb once,
# check on a few small shapes that cover each dtype, mask and odd tile sizes
# (and the backward's gradients with --backward), bench's JSON (one shape,
# --seqs, --model-only, --decode, --varlen, --backward, --block-mask) validated
# line by line, tune on a tiny shape and the tune file it writes (in a temp
# FLASHATTN_TUNE_FILE, read back by a later call), and the usage exit status. Meant for
# ctest and for sanitizer builds (ASan's leak check turns a leak into a
# non-zero exit).
#
#   tools/smoke.sh path/to/flashattn
# Exits non-zero when anything failed; always ends with "N passed, N failed".
set -u

bin=${1:?usage: smoke.sh path/to/flashattn}
passed=0
failed=0
out=$(mktemp)
err=$(mktemp)
tunedir=$(mktemp -d)
trap 'rm -f "$out" "$err"; rm -rf "$tunedir"' EXIT
# Every run reads and writes its tune file here, never the user's cache.
export FLASHATTN_TUNE_FILE="$tunedir/tune.txt"

# expect STATUS NAME CMD...: runs CMD, passes when it exits with STATUS.
expect() {
    local want=$1 name=$2
    shift 2
    "$@" >"$out" 2>&1
    local got=$?
    if [ "$got" -eq "$want" ]; then
        passed=$((passed + 1))
        echo "ok    $name"
    else
        failed=$((failed + 1))
        echo "FAIL  $name (exit $got, want $want)"
        sed 's/^/      /' "$out"
    fi
}

expect 0 "info" "$bin" info
expect 0 "help" "$bin" help
expect 0 "bench --help" "$bin" bench --help
expect 0 "check default" "$bin" check --seq 128
expect 0 "check f16 causal" "$bin" check --dtype f16 --seq 96 --causal
expect 0 "check bf16 GQA" "$bin" check --dtype bf16 --heads 8 --kv-heads 2 --seq 64 --seq-kv 80
expect 0 "check MQA top-left Sq>Sk" "$bin" check --heads 4 --kv-heads 1 --seq 70 --seq-kv 33 --causal=top-left
expect 0 "check window Dv!=D" "$bin" check --seq 100 --dim 40 --dim-v 24 --window 8,3 --batch 2
expect 0 "check standard" "$bin" check --algo standard --seq 64 --causal --dtype f16
expect 0 "check one thread" "$bin" check --threads 1 --seq 65 --dim 33

# expect_json NAME CHECK CMD...: runs CMD, passes when it exits 0, every line of
# its stdout is a JSON object, and the python code CHECK (which sees them as
# `objs`, and stdout as `text`) raises nothing. stderr stays apart: only stdout
# has to be JSON. expect_text is the same without the JSON.
expect_json() { expect_py json "$@"; }
expect_text() { expect_py text "$@"; }
expect_py() {
    local mode=$1 name=$2 check=$3
    shift 3
    "$@" >"$out" 2>"$err"
    local status=$?
    if [ "$status" -eq 0 ] && python3 -c "
import json, sys
text = open(sys.argv[1]).read()
objs = [json.loads(l) for l in text.splitlines() if l.strip()] if sys.argv[2] == 'json' else []
$check" "$out" "$mode"; then
        passed=$((passed + 1))
        echo "ok    $name"
    else
        failed=$((failed + 1))
        echo "FAIL  $name (exit $status)"
        sed 's/^/      /' "$out" "$err"
    fi
}

# bench --json: every line an object whose fields start with the documented
# ones, and the share of the probed peak next to the rate it divides.
expect_json "bench --json" '
want = ["algo", "isa", "dtype", "B", "Hq", "Hk", "Sq", "Sk", "D", "Dv", "causal",
        "threads", "median_ms", "gflops", "extra_bytes"]
for o in objs:
    assert list(o)[:len(want)] == want, list(o)
    assert o["Sq"] == 128 and o["Hq"] == 2 and o["causal"] == "none", o
    assert o["median_ms"] is None or o["median_ms"] > 0, o
    assert o["peak_kind"] == "fp32_fma", o
    if o["peak_gflops"] is not None and o["algo"] != "reference":
        assert o["pct_peak"] > 0 and abs(o["pct_peak"] - 100 * o["gflops"] / o["peak_gflops"]) < 1e-3 * o["pct_peak"], o
assert [o["algo"] for o in objs] == ["flash", "standard", "reference"], objs
assert objs[0]["tile_q"] > 0 and objs[0]["tile_kv"] > 0 and objs[1]["tile_q"] is None, objs
assert objs[2]["pct_peak"] is None, objs[2]
' "$bin" bench --seq 128 --heads 2 --runs 2 --json
expect_json "bench --no-probe" '
assert [o["algo"] for o in objs] == ["flash"], objs
assert objs[0]["peak_gflops"] is None and objs[0]["pct_peak"] is None, objs
assert objs[0]["gflops"] > 0, objs
' "$bin" bench --seq 64 --heads 2 --runs 1 --algo flash --json --no-probe
expect_json "bench --tile-q --tile-kv" '
assert objs[0]["tile_q"] == 32 and objs[0]["tile_kv"] == 48, objs
' "$bin" bench --seq 100 --heads 2 --runs 1 --algo flash --json --no-probe --tile-q 32 --tile-kv 48
expect 0 "bench table causal bf16" "$bin" bench --seq 64 --heads 2 --runs 1 --dtype bf16 --causal --no-probe
# --profile: the flash row carries the phases of one profiled call; the phases, the
# packing and the rest share out its threads x wall time, and the phases' products are
# the call's FLOPs (the band's kept pairs), whatever the path (f32, bf16 fused or not)
profile_check='
keys = ["profile_wall_ms"] + ["phase_%s_%s" % (k, f) for k in "SXPM" for f in ("ms", "share", "gflop", "pct_peak")] \
       + ["phase_%s_%s" % (k, f) for k in ("pack", "rest") for f in ("ms", "share")]
o = objs[0]
assert o["algo"] == "flash" and all(k in o for k in keys), o
slack = 100 * 6e-3 / (o["threads"] * o["profile_wall_ms"]) + 0.01  # six times in whole microseconds
assert abs(sum(o["phase_%s_share" % k] for k in ("S", "X", "P", "M", "pack", "rest")) - 100) < slack, o
assert abs(sum(o["phase_%s_gflop" % k] for k in "SXPM") * 1e9 - o["flops"]) <= 1e-6 * o["flops"], o
assert o["phase_P_ms"] > 0 and o["phase_P_gflop"] > 0, o
for k in "SXPM":
    assert (o["phase_%s_pct_peak" % k] is None) == (o["peak_gflops"] is None or o["phase_%s_gflop" % k] == 0), o
'
expect_json "bench --profile f32 causal" "$profile_check" \
    "$bin" bench --seq 100 --heads 2 --runs 1 --algo flash --json --causal --tile-q 32 --tile-kv 48 --profile
expect_json "bench --profile bf16" "$profile_check" \
    "$bin" bench --seq 200 --heads 4 --runs 1 --algo flash --json --no-probe --dtype bf16 --profile
expect_json "bench --profile bf16 causal" "$profile_check" \
    "$bin" bench --seq 96 --heads 2 --runs 1 --algo flash --json --no-probe --dtype bf16 --causal --profile
# --backward --profile: the flash backward row carries the backward's phases; on one
# thread (one fused walk) with D = Dv their products are the row's credited FLOPs
# (2 per kept pair and dimension of S, dP, dV, dK, dQ: 10 D = 2.5 x the forward's 4 D)
bwd_profile_check='
ph = ("S", "X", "dP", "dS", "dV", "dK", "dQ")
keys = ["profile_wall_ms"] + ["phase_%s_%s" % (k, f) for k in ph for f in ("ms", "share", "gflop", "pct_peak")]
o = [x for x in objs if x["algo"] == "flash" and x["pass"] == "backward"][0]
assert all(k in o for k in keys) and all("profile_wall_ms" not in x for x in objs if x is not o), objs
assert abs(sum(o["phase_%s_gflop" % k] for k in ph) * 1e9 - o["flops"]) <= 1e-6 * o["flops"], o
slack = 100 * 9e-3 / (o["threads"] * o["profile_wall_ms"]) + 0.01
assert abs(sum(o["phase_%s_share" % k] for k in ph + ("pack", "rest")) - 100) < slack, o
'
expect_json "bench --backward --profile f32 causal" "$bwd_profile_check" \
    "$bin" bench --backward --seq 100 --heads 2 --runs 1 --algo flash --json --causal --threads 1 --profile
expect_json "bench --backward --profile bf16" "$bwd_profile_check" \
    "$bin" bench --backward --seq 130 --heads 2 --runs 1 --algo flash --json --no-probe --dtype bf16 --threads 1 --profile
expect_text "bench --backward --profile table" '
assert "# flash backward profile" in text and "#   dQ " in text and "#   rest" in text, text
' "$bin" bench --backward --seq 64 --heads 2 --runs 1 --algo flash --no-probe --threads 1 --profile
expect_text "bench --profile table" '
assert "# flash profile" in text and "#   P " in text and "#   rest" in text, text
' "$bin" bench --seq 64 --heads 2 --runs 1 --algo flash --no-probe --profile

# --seqs: one row per N, flash against standard, with the traffic model.
expect_text "bench --seqs table" '
rows = [l.split()[0] for l in text.splitlines() if l and not l.startswith("#")]
assert rows == ["N", "64", "128"], rows
assert "% peak" in text and "# peak" in text, text
' "$bin" bench --seqs 64,128 --heads 2 --dim 32 --runs 1
expect_json "bench --seqs --json" '
assert [o["N"] for o in objs] == [64, 128], objs
for o in objs:
    assert o["Sq"] == o["Sk"] == o["N"] and o["Hq"] == 2 and o["D"] == 32, o
    assert o["flash_ms"] > 0 and o["standard_ms"] > 0, o
    assert abs(o["speedup"] - o["standard_ms"] / o["flash_ms"]) < 1e-3 * o["speedup"], o
    assert o["tile_q"] > 0 and o["tile_kv"] > 0, o
    assert o["peak_gflops"] is None or o["pct_peak"] > 0, o
    assert o["flash_extra_bytes"] > 0 and o["standard_extra_bytes"] > 0, o
    for a in ("flash", "standard"):
        assert o[a + "_traffic_bytes"] == o[a + "_read_bytes"] + o[a + "_write_bytes"] > 0, o
' "$bin" bench --seqs 64,128 --heads 2 --dim 32 --runs 1 --json --causal
expect_json "bench --model-only" '
assert [o["algo"] for o in objs] == ["flash", "standard"], objs
f, s = objs
assert f["tile_q"] > 0 and f["passes"] >= 1 and (f["passes"] == 1 or not f["resident"]), f
assert s["s_bytes"] == 2048 * 2048 * 4 and s["resident"] == (s["s_bytes"] <= s["l2_bytes"]), s
assert s["passes"] == (0 if s["resident"] else 5), s
for o in objs:
    assert o["traffic_bytes"] == o["read_bytes"] + o["write_bytes"] > 0, o
    assert o["write_bytes"] >= o["write_miss_bytes"] > 0, o
if not s["resident"]:
    assert s["read_bytes"] > f["read_bytes"] and s["write_bytes"] > f["write_bytes"], objs
' "$bin" bench --model-only --json --heads 1 --seq 2048 --dim 16
expect_text "bench --warmup-only --cold" '
assert text == "", text
' "$bin" bench --seq 64 --heads 2 --warmup-only --cold=65536 --algo standard

# --decode: a KV cache, timed; the bytes and FLOPs it is credited with follow
# from the flags alone, so they are checked exactly.
expect_json "bench --decode --json" '
want = ["mode", "isa", "dtype", "Hq", "Hk", "D", "Dv", "causal"]
(o,) = objs
assert list(o)[:len(want)] == want, list(o)
assert o["mode"] == "decode" and o["kv_dtype"] == "f16" and o["page_size"] == 0, o
assert o["B"] == 1 and o["q_rows"] == 1 and o["cache_len_min"] == o["cache_len_max"] == 300, o
assert o["kv_bytes"] == 300 * 2 * (32 + 32) * 2, o
assert o["flops"] == 2 * (32 + 32) * 300 * 4, o
assert o["median_ms"] > 0 and o["kv_splits"] >= 1 and o["kv_splits_forced"] is None, o
assert abs(o["gbps"] - o["kv_bytes"] / o["median_ms"] * 1e-6) < 1e-3 * o["gbps"], o
assert o["cold_bytes"] == 0, o
if o["read_bw_gbps"] is not None:
    assert o["read_bw_gbps"] > 0 and abs(o["pct_read_bw"] - 100 * o["gbps"] / o["read_bw_gbps"]) < 1e-3 * o["pct_read_bw"], o
' "$bin" bench --decode --cache-len 300 --heads 4 --kv-heads 2 --dim 32 --runs 2 --warm --json
expect_text "bench --decode table paged i8 ragged" '
lines = [l for l in text.splitlines() if l and not l.startswith("#")]
head, row = lines
for col in ("median ms", "GB/s", "% read bw", "GFLOP/s", "splits", "cache len"):
    assert col in head, head
assert " i8 " in row and "paged 16" in row and "64..700" in row, row
assert "scales" in text and "read bandwidth: not measured" in text, text
' "$bin" bench --decode --batch 3 --cache-len 64:700 --page-size 16 --kv-dtype i8 --heads 4 --kv-heads 1 --dim 32 --runs 1 --no-probe --cold=65536
expect_json "bench --decode bf16 q-rows causal forced splits" '
(o,) = objs
assert o["kv_dtype"] == "bf16" and o["page_size"] == 5 and o["q_rows"] == 4, o
assert o["causal"] == "bottom-right" and o["B"] == 2, o
# two sequences of 200: 4 rows keep 197..200 keys each, all 200 rows are read
assert o["flops"] == 2 * 64 * (2 * (197 + 198 + 199 + 200)) * 4, o
assert o["kv_bytes"] == 2 * 200 * 1 * 64 * 2, o
assert o["kv_splits_forced"] == 3 and o["kv_splits"] == 3, o
' "$bin" bench --decode --batch 2 --cache-len 200 --q-rows 4 --causal --page-size 5 --kv-dtype bf16 --kv-splits 3 --heads 4 --kv-heads 1 --dim 32 --runs 1 --no-probe --warm --json
expect 0 "bench --decode f32 cache" "$bin" bench --decode --cache-len 100 --kv-dtype f32 --heads 2 --dim 16 --runs 1 --no-probe --cold=65536
# --decode --profile: the decode row carries the phases of one profiled call (split-KV:
# M holds the merge); the same sums as the one-shape bench's profile_check
expect_json "bench --decode --profile i8 forced splits" "$profile_check" \
    "$bin" bench --decode --cache-len 700 --kv-dtype i8 --heads 4 --kv-heads 1 --dim 32 --kv-splits 3 --runs 1 --no-probe --cold=65536 --json --profile
expect_json "bench --decode --profile bf16 warm" "$profile_check" \
    "$bin" bench --decode --batch 2 --cache-len 200 --q-rows 4 --causal --kv-dtype bf16 --heads 4 --kv-heads 2 --dim 32 --runs 1 --no-probe --warm --json --profile
expect_text "bench --decode --profile table" '
assert "# flash profile" in text and "#   M " in text and "#   rest" in text, text
' "$bin" bench --decode --cache-len 300 --heads 4 --kv-heads 2 --dim 32 --runs 1 --no-probe --warm --profile
# --profile splits one timed shape: refused where no single flash call is timed
expect 2 "bench --profile with --seqs" "$bin" bench --seqs 32,64 --heads 2 --runs 1 --no-probe --profile
expect 2 "bench --profile with --varlen" "$bin" bench --varlen 16,32 --heads 2 --runs 1 --no-probe --profile
expect 2 "bench --profile with --block-mask" "$bin" bench --block-mask full --seq 32 --heads 2 --runs 1 --no-probe --profile
expect 2 "bench --profile with --model-only" "$bin" bench --model-only --seq 32 --profile

# --varlen: packed sequences, then a dense batch of (nearly) the same kept pairs.
expect_json "bench --varlen --json" '
v, d = objs
assert v["mode"] == "varlen" and d["mode"] == "dense", objs
assert v["lengths"] == [37, 100, 64] and v["seqs"] == d["seqs"] == 3 and v["B"] == 1, objs
assert v["tokens"] == 201 and d["tokens"] == d["B"] * d["S"], objs
pairs = sum(n * (n + 1) // 2 for n in (37, 100, 64))
assert v["flops"] == 2 * 32 * pairs * 2, v
# the dense batch: about the same tokens, and the kept pairs within one row per sequence
assert abs(d["tokens"] - v["tokens"]) <= 0.25 * v["tokens"], objs
assert abs(d["flops"] - v["flops"]) <= 2 * 32 * 2 * d["B"] * d["S"], objs
for o in objs:
    assert o["median_ms"] > 0 and o["gflops"] > 0 and o["causal"] == "bottom-right", o
    assert abs(o["varlen_vs_dense"] - v["gflops"] / d["gflops"]) < 1e-3 * o["varlen_vs_dense"], o
' "$bin" bench --varlen 37,100,64 --heads 2 --dim 16 --causal --runs 1 --no-probe --json
expect_text "bench --varlen N:LO-HI table" '
rows = [l.split()[0] for l in text.splitlines() if l and not l.startswith("#")]
assert rows == ["mode", "varlen", "dense", "varlen"], rows
assert "# lengths (5): " in text and "varlen / dense GFLOP/s: " in text, text
lens = sorted(int(x) for x in text.split("# lengths (5): ")[1].split()[0].split(","))
assert lens == [10, 20, 30, 40, 50], lens
' "$bin" bench --varlen 5:10-50 --heads 2 --dim 16 --runs 1 --no-probe

# --block-mask: the block mask, the same mask dense, the call that equals it, no mask;
# every row credited the mask's kept pairs (fa_forward_work of the block-masked call).
expect_json "bench --block-mask causal --json" '
rows = [o["variant"] for o in objs]
assert rows == ["block mask", "dense mask", "causal", "no mask"], rows
n, b = 100, 16
assert all(o["mode"] == "block_mask" and o["spec"] == "causal" and o["block"] == b for o in objs), objs
assert abs(objs[0]["kept"] - (n * (n + 1) // 2) / (n * n)) < 1e-6, objs[0]
blocks = (n + b - 1) // b
assert objs[0]["entries"] == blocks * (blocks + 1) // 2 and objs[0]["partial"] >= 1, objs[0]
for o in objs:
    assert o["median_ms"] > 0 and o["gflops"] > 0, o
    # the JSON prints six significant digits, so the ratio of two printed values is off by up to ~1e-5
    assert abs(o["vs_dense"] - o["median_ms"] / objs[1]["median_ms"]) < 2e-5 * o["vs_dense"] + 1e-9, o
' "$bin" bench --block-mask causal --block-size 16 --seq 100 --heads 2 --dim 16 --runs 1 --no-probe --json
expect_text "bench --block-mask doc table" '
rows = [l.split()[0] for l in text.splitlines() if l and not l.startswith("#")]
assert rows == ["call", "block", "dense", "varlen", "no"], rows
' "$bin" bench --block-mask doc:3 --block-size 8 --seq 90 --heads 2 --dim 16 --runs 1 --no-probe
expect 2 "bench --block-mask bad spec" "$bin" bench --block-mask random:2 --seq 16 --runs 1 --no-probe
expect 2 "bench --block-mask with --backward" "$bin" bench --block-mask full --backward --seq 16 --runs 1

# --backward: check compares dq, dk, dv with the reference (PASS and the
# documented lines), bench times the backward and the training step.
check_backward='
import re
lines = text.splitlines()
assert lines[0].startswith("check flash backward vs reference: "), lines[0]
for name in ("o", "lse", "dq", "dk", "dv"):
    (l,) = [l for l in lines if l.strip().startswith("max |%s - %s_ref|" % (name, name))]
    err, tol = (float(x) for x in re.findall(r"[0-9.]+e[-+][0-9]+", l)[:2])
    assert 0 <= err <= tol, l
assert lines[-1] == "PASS", lines[-1]
'
expect_text "check --backward f32 causal GQA" "$check_backward" \
    "$bin" check --backward --seq 70 --seq-kv 90 --heads 4 --kv-heads 2 --dim 32 --causal
expect_text "check --backward bf16 causal GQA" "$check_backward
assert \"x max|dq_ref|\" in text and \"0.0312 x\" in text, text
" "$bin" check --backward --dtype bf16 --seq 64 --heads 8 --kv-heads 2 --dim 40 --dim-v 24 --causal
expect_text "check --backward f16 dropout window" "$check_backward
assert \"dropout=0.2\" in lines[0], lines[0]
" "$bin" check --backward --dtype f16 --seq 48 --heads 2 --dim 16 --window 5,2 --dropout 0.2
expect 0 "check forward with dropout" "$bin" check --seq 64 --dropout 0.5 --causal
expect_text "bench --kv-pack: f16 K/V packed once per kv head, or never" '
import json
rows = [json.loads(l) for l in text.splitlines()]
assert [r["kv_packed"] for r in rows] == [2], rows
assert rows[0]["kv_pack_ms"] > 0, rows
' "$bin" bench --algo flash --dtype f16 --seq 300 --heads 2 --dim 32 --tile-q 64 --runs 1 --json --no-probe
expect_text "... --kv-pack 1 packs nothing" '
import json
rows = [json.loads(l) for l in text.splitlines()]
assert [r["kv_packed"] for r in rows] == [0] and rows[0]["kv_pack_ms"] == 0, rows
' "$bin" bench --algo flash --dtype f16 --seq 300 --heads 2 --dim 32 --tile-q 64 --runs 1 --json --no-probe --kv-pack 1
expect 2 "bad --kv-pack" "$bin" bench --kv-pack 3
expect_text "bench --backward table" '
rows = [l.split()[:2] for l in text.splitlines() if l and not l.startswith("#")]
assert rows == [["algo", "pass"], ["flash", "backward"], ["flash", "fwd+bwd"],
                ["standard", "backward"], ["standard", "fwd+bwd"]], rows
assert "# peak" in text and "2.5 x" in text and "3.5 x" in text, text
' "$bin" bench --backward --seq 256 --heads 2 --runs 2
expect_json "bench --backward --json" '
want = ["algo", "isa", "dtype", "B", "Hq", "Hk", "Sq", "Sk", "D", "Dv", "causal",
        "threads", "median_ms", "gflops", "extra_bytes", "pass"]
assert [(o["algo"], o["pass"]) for o in objs] == [("flash", "backward"), ("flash", "fwd+bwd"),
        ("standard", "backward"), ("standard", "fwd+bwd")], objs
fwd = 2 * (128 + 128) * 256 * 256 * 2
for o in objs:
    assert list(o)[:len(want)] == want, list(o)
    assert o["Sq"] == 256 and o["Hq"] == 2 and o["runs"] == 2, o
    # 6 significant digits in the JSON
    assert abs(o["flops"] - (2.5 if o["pass"] == "backward" else 3.5) * fwd) < 1e-5 * o["flops"], o
    assert o["median_ms"] > 0 and o["extra_bytes"] > 0, o
    assert abs(o["gflops"] - o["flops"] / o["median_ms"] * 1e-6) < 1e-3 * o["gflops"], o
    assert o["peak_kind"] == "fp32_fma", o
    if o["peak_gflops"] is not None:
        assert abs(o["pct_peak"] - 100 * o["gflops"] / o["peak_gflops"]) < 1e-3 * o["pct_peak"], o
    assert (o["tile_q"] is None) == (o["algo"] == "standard"), o
    assert o["backward_passes"] in ((1, 2) if o["algo"] == "flash" else (0,)), o
    if o["algo"] == "standard":
        assert o["speedup_vs_standard"] == 1, o
' "$bin" bench --backward --seq 256 --heads 2 --runs 2 --json
expect_text "bench --backward names the two-pass schedule (one MQA sequence, 2 threads)" '
rows = [l.split()[:3] for l in text.splitlines() if l.startswith("flash")]
assert rows == [["flash", "backward", "2-pass"], ["flash", "fwd+bwd", "2-pass"]], rows
' "$bin" bench --backward --algo flash --threads 2 --seq 200 --heads 4 --kv-heads 1 --dim 32 --runs 1 --no-probe
expect_text "bench --backward --seqs table" '
lines = [l for l in text.splitlines() if l and not l.startswith("#")]
assert [l.split()[0] for l in lines] == ["N", "128", "256"], lines
for col in ("flash ms", "standard ms", "speedup", "GFLOP/s", "% peak", "flash extra", "std extra"):
    assert col in lines[0], lines[0]
assert "traffic" not in lines[0] and "# peak" in text, text
' "$bin" bench --backward --seqs 128,256 --heads 2 --dim 32 --runs 1
expect_json "bench --backward --seqs --json" '
assert [o["N"] for o in objs] == [128, 256], objs
for o in objs:
    assert o["pass"] == "backward" and o["Sq"] == o["Sk"] == o["N"] and o["causal"] == "bottom-right", o
    assert abs(o["flops"] - 2.5 * 2 * 64 * o["N"] * (o["N"] + 1) // 2 * 2) < 1e-5 * o["flops"], o
    assert o["flash_ms"] > 0 and o["standard_ms"] > 0, o
    assert abs(o["speedup"] - o["standard_ms"] / o["flash_ms"]) < 1e-3 * o["speedup"], o
    assert o["flash_extra_bytes"] > 0 and o["standard_extra_bytes"] > 0, o
    assert o["peak_gflops"] is None and o["pct_peak"] is None, o
' "$bin" bench --backward --seqs 128,256 --heads 2 --dim 32 --runs 1 --causal --json --no-probe

# check with tiles that do not divide the shape, and tune on a tiny shape.
expect 0 "check tiles 16x48" "$bin" check --seq 100 --tile-q 16 --tile-kv 48
expect 0 "check odd tiles causal" "$bin" check --seq 37 --seq-kv 53 --causal --tile-q 7 --tile-kv 5
expect 0 "tune --help" "$bin" tune --help
expect_text "tune tiny" '
lines = [l for l in text.splitlines() if not l.startswith("saved ")]
assert lines[-1].startswith("best ") and lines[-2].startswith("planned "), lines
ranks = [l.split()[0] for l in lines if l[:1] == " " or l[:1].isdigit()]
assert 2 <= len(ranks) <= 26 and ranks == [str(i + 1) for i in range(len(ranks))], lines
' "$bin" tune --seq 48 --heads 1 --dim 16 --runs 1
expect_text "tune pinned tile-q" '
tiles = [l.split()[1] for l in text.splitlines() if l.strip()[:1].isdigit() and "planned" not in l]
assert tiles and all(t.startswith("16x") for t in tiles), tiles
' "$bin" tune --seq 48 --heads 1 --dim 16 --runs 1 --tile-q 16 --no-save

# The tune file: tune saves its best pair where FLASHATTN_TUNE_FILE says, one entry
# per shape class (a second class is added, the same class replaced), in the
# documented format; a later call of that class plans the saved tiles (the verbose
# trace says "tuned", and that the file was read).
rm -f "$FLASHATTN_TUNE_FILE"
"$bin" tune --seq 48 --heads 1 --dim 16 --runs 1 >/dev/null 2>&1
"$bin" tune --seq 100 --heads 2 --kv-heads 1 --dim 16 --runs 1 --causal >/dev/null 2>&1
expect_text "tune saves to FLASHATTN_TUNE_FILE" '
import os, re
path = os.environ["FLASHATTN_TUNE_FILE"]
saved = [l for l in text.splitlines() if l.startswith("saved ")]
assert len(saved) == 1 and " to " + path + " for " in saved[0], text
lines = open(path).read().split("\n")
assert lines[0] == "flashattn-tune 1" and lines[-1] == "", lines
entries = [l for l in lines[1:-1] if l and not l.startswith("#")]
assert len(entries) == 2, entries
keys = set()
for e in entries:
    head, cpu = e.split(" cpu=", 1)
    f = dict(kv.split("=", 1) for kv in head.split())
    assert sorted(f) == sorted(["isa", "dtype", "d", "dv", "sk", "rows", "masked", "tile_q", "tile_kv"]), e
    assert cpu.strip() and f["dtype"] == "f32" and f["d"] == f["dv"] == "16", e
    for n in ("d", "dv", "sk", "rows", "tile_q", "tile_kv"):
        assert re.fullmatch("[1-9][0-9]*", f[n]), e
    for n in ("sk", "rows"):
        assert int(f[n]) & (int(f[n]) - 1) == 0, e
    keys.add((f["sk"], f["rows"], f["masked"]))
assert keys == {("64", "64", "0"), ("128", "256", "1")}, keys
' "$bin" tune --seq 48 --heads 1 --dim 16 --runs 1
expect_text "a later call plans the tuned tiles" '
import os
e = [l for l in open(os.environ["FLASHATTN_TUNE_FILE"]) if " masked=1 " in l][0]
f = dict(kv.split("=", 1) for kv in e.split(" cpu=")[0].split())
want = "%dx%d" % (min(int(f["tile_q"]), 200), min(int(f["tile_kv"]), 100)) # clamped to Sq*2, Sk
flash = [l for l in text.splitlines() if l.startswith("flashattn_verbose,exec,flash")]
assert len(flash) == 1 and ",tiles:%s (tuned),tune:read " % want in flash[0], (want, text)
assert "2 entries for this CPU and isa" in flash[0], flash[0]
' env FLASHATTN_VERBOSE=1 sh -c '"$0" check --seq 100 --heads 2 --kv-heads 1 --dim 16 --causal 2>&1' "$bin"
printf 'not a tune file\n' >"$tunedir/other.txt"
expect 1 "tune leaves a file that is not a tune file alone" \
    env FLASHATTN_TUNE_FILE="$tunedir/other.txt" "$bin" tune --seq 16 --heads 1 --dim 8 --runs 1
expect 0 "... and it is unchanged" grep -qx 'not a tune file' "$tunedir/other.txt"

expect 2 "no verb" "$bin"
expect 2 "unknown verb" "$bin" frobnicate
expect 2 "bad flag" "$bin" bench --no-such-flag
expect 2 "bad number" "$bin" check --seq 12x
expect 2 "missing value" "$bin" check --seq
expect 2 "bad dtype" "$bin" bench --dtype f64
expect 2 "heads not a multiple" "$bin" check --heads 6 --kv-heads 4
expect 2 "bad --seqs" "$bin" bench --seqs 64,x
expect 2 "--seqs with --algo" "$bin" bench --seqs 64 --algo flash
expect 2 "negative tile" "$bin" check --tile-q -1
expect 2 "tile above the library's bound" "$bin" bench --tile-kv 999999
expect 2 "bad --cold" "$bin" bench --cold=12
expect 2 "tune another algo" "$bin" tune --algo standard
expect 2 "bad --kv-dtype" "$bin" bench --decode --kv-dtype f64
expect 2 "bad --cache-len" "$bin" bench --decode --cache-len 9:3
expect 2 "bad --page-size" "$bin" bench --decode --page-size -1
expect 2 "--kv-splits above the library's bound" "$bin" bench --decode --kv-splits 100000
expect 2 "decode flag without --decode" "$bin" bench --q-rows 2
expect 2 "--decode with --seq" "$bin" bench --decode --seq 64
expect 2 "--decode with --varlen" "$bin" bench --decode --varlen 4,5
expect 2 "--warm with --cold" "$bin" bench --decode --warm --cold
expect 2 "bad --varlen" "$bin" bench --varlen 8:100
expect 2 "bad --varlen list" "$bin" bench --varlen 10,0
expect 2 "--varlen with --seqs" "$bin" bench --varlen 4,5 --seqs 64
expect 2 "bad --dropout" "$bin" check --backward --dropout 1
expect 2 "--backward with --decode" "$bin" bench --backward --decode
expect 2 "--backward with --model-only" "$bin" bench --backward --model-only
expect 2 "--dropout with --decode" "$bin" bench --decode --dropout 0.1
expect 1 "unavailable FLASHATTN_ARCH" env FLASHATTN_ARCH=no-such-isa "$bin" info

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
