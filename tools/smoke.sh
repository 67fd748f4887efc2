#!/usr/bin/env bash
# smoke.sh: a quick end-to-end run of the `flashattn` program: every verb once,
# check on a few small shapes that cover each dtype and mask, bench's JSON
# validated line by line, and the usage exit status. Meant for ctest and for
# sanitizer builds (ASan's leak check turns a leak into a non-zero exit).
#
#   tools/smoke.sh path/to/flashattn
# Exits non-zero when anything failed; always ends with "N passed, N failed".
set -u

bin=${1:?usage: smoke.sh path/to/flashattn}
passed=0
failed=0
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

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

# bench --json: every line an object whose fields start with the documented ones.
# stderr stays apart: only stdout has to be JSON.
"$bin" bench --seq 128 --heads 2 --runs 2 --json >"$out" 2>"$err"
status=$?
if [ "$status" -eq 0 ] && python3 -c '
import json, sys
want = ["algo", "isa", "dtype", "B", "Hq", "Hk", "Sq", "Sk", "D", "Dv", "causal",
        "threads", "median_ms", "gflops", "extra_bytes"]
lines = [l for l in open(sys.argv[1]) if l.strip()]
algos = []
for l in lines:
    o = json.loads(l)
    assert list(o)[:len(want)] == want, list(o)
    assert o["Sq"] == 128 and o["Hq"] == 2 and o["causal"] == "none", o
    assert o["median_ms"] is None or o["median_ms"] > 0, o
    algos.append(o["algo"])
assert algos == ["flash", "standard", "reference"], algos
' "$out"; then
    passed=$((passed + 1))
    echo "ok    bench --json"
else
    failed=$((failed + 1))
    echo "FAIL  bench --json (exit $status)"
    sed 's/^/      /' "$out" "$err"
fi
expect 0 "bench table causal bf16" "$bin" bench --seq 64 --heads 2 --runs 1 --dtype bf16 --causal

expect 2 "no verb" "$bin"
expect 2 "unknown verb" "$bin" frobnicate
expect 2 "bad flag" "$bin" bench --no-such-flag
expect 2 "bad number" "$bin" check --seq 12x
expect 2 "missing value" "$bin" check --seq
expect 2 "bad dtype" "$bin" bench --dtype f64
expect 2 "heads not a multiple" "$bin" check --heads 6 --kv-heads 4
expect 1 "unavailable FLASHATTN_ARCH" env FLASHATTN_ARCH=no-such-isa "$bin" info

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
