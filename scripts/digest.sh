#!/bin/bash
# Bits unchanged: runs the fixed matrix of tests/digest/digest.c through two builds'
# libraries, on every kernel path this machine runs and at several thread counts, and
# compares the hashes case by case (docs/contributing.md, "Bits unchanged").
#
#   scripts/digest.sh OLD_BUILD NEW_BUILD [ISAS] [THREADS]
#
# OLD_BUILD, NEW_BUILD: CMake build directories (each with libflashattn.a; its source
# tree, for the header, is read from its CMakeCache.txt). digest.c is this tree's, built
# against each tree's own header, so forms an older header lacks are left out.
# ISAS: the paths, default the x86 test matrix (ref avx2 avx2vnni avx512 avx512bf16
# avx512bf16-dot amx amx-fused amx-model; -dot forces FLASHATTN_BF16_DOT=1, -fused
# FLASHATTN_BF16_FUSED=1); a path this CPU or build lacks is reported and skipped.
# THREADS: default 1,2,3. Exit status 0 when every case present in both is equal.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OLD_BUILD NEW_BUILD [ISAS] [THREADS]" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")/.." && pwd)
old=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
isas=${3:-"ref avx2 avx2vnni avx512 avx512bf16 avx512bf16-dot amx amx-fused amx-model"}
threads=${4:-1,2,3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build() { # build dir -> binary
  local src
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$1/CMakeCache.txt")
  ${CC:-cc} -O2 -std=c11 -I"$src/include" "$here/tests/digest/digest.c" "$1/libflashattn.a" -lm -lpthread \
    -o "$work/$2"
}
build "$old" old
build "$new" new

for isa in $isas; do
  env=(FLASHATTN_ARCH="$isa")
  case $isa in
    *-dot) env=(FLASHATTN_ARCH="${isa%-dot}" FLASHATTN_BF16_DOT=1) ;;
    *-fused) env=(FLASHATTN_ARCH="${isa%-fused}" FLASHATTN_BF16_FUSED=1) ;;
  esac
  for side in old new; do
    env "${env[@]}" "$work/$side" --threads "$threads" | sed "s/^/$isa /" >"$work/$side.$isa"
  done
done

# Compare: "isa t=N case value" lines, keyed by the first three words.
python3 - "$work" $isas <<'PY'
import sys
work, isas = sys.argv[1], sys.argv[2:]
bad = 0
total = {"equal": 0, "differ": 0, "only": 0}
for isa in isas:
    sides = {}
    for side in ("old", "new"):
        lines = open(f"{work}/{side}.{isa}").read().split("\n")
        head = lines[0].split()[1]
        rows = {}
        for ln in lines[1:]:
            w = ln.split()
            if len(w) == 4 and w[3] != "absent":
                rows[(w[1], w[2])] = w[3]
        sides[side] = (head, rows)
    (oh, o), (nh, n) = sides["old"], sides["new"]
    if "unavailable" in oh or "unavailable" in nh:
        print(f"{isa:15s} skipped: old {oh}, new {nh}")
        continue
    eq = [k for k in o if k in n and o[k] == n[k]]
    diff = sorted(k for k in o if k in n and o[k] != n[k])
    only = sorted(set(o) ^ set(n))
    # thread counts that disagree within one build (informational: the contract says
    # which outputs are bitwise over threads)
    varies = {}
    for side, rows in (("old", o), ("new", n)):
        cases = {}
        for (t, c), v in rows.items():
            cases.setdefault(c, set()).add(v)
        varies[side] = sorted(c for c, vs in cases.items() if len(vs) > 1)
    total["equal"] += len(eq); total["differ"] += len(diff); total["only"] += len(only)
    print(f"{isa:15s} ({nh}) equal {len(eq)}, differ {len(diff)}, in one build only {len(only)}"
          + (f"; over threads old {varies['old']} new {varies['new']}" if varies["old"] or varies["new"] else ""))
    for t, c in diff:
        print(f"  DIFFER {isa} {t} {c}: old {o[(t, c)]} new {n[(t, c)]}")
    if only:
        print(f"  ONLY   {isa}: " + ", ".join(sorted({("old " if k in o else "new ") + k[1] for k in only})))
    bad += len(diff)
print(f"total: equal {total['equal']}, differ {total['differ']}, in one build only {total['only']}")
sys.exit(1 if bad else 0)
PY
