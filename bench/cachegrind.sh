#!/usr/bin/env bash
# bench/cachegrind.sh: the main-memory traffic of ONE attention head, measured
# with valgrind's cachegrind, next to what the model in tools/traffic.c says
# (bench/README.md explains both and how they are compared).
#
#   bash bench/cachegrind.sh [N] [path/to/flashattn]
#
# Shape: B=1, H=1, Sq=Sk=N (default 2048), D=128, f32, one thread. The
# simulated last-level cache is this machine's per-core L2 (getconf, else
# 2 MiB 16-way), so an "LL miss" is exactly what the model calls traffic.
# Without a binary it builds one (Release) in build/, like scripts/bench.sh.
# Takes minutes: valgrind runs the kernels some hundreds of times slower.
set -euo pipefail
cd "$(dirname "$0")/.."

n=${1:-2048}
bin=${2:-}
case $n in '' | *[!0-9]*) echo "usage: bench/cachegrind.sh [N] [path/to/flashattn]" >&2; exit 2 ;; esac

bash scripts/deps.sh valgrind
if [ -z "$bin" ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j "$(nproc)" --target flashattn_cli >/dev/null
  bin=./build/flashattn
fi

# The per-core L2 as the simulated LL. cachegrind wants size / (assoc * 64) to
# be a power of two; an L2 that is not (rare) falls back to 2 MiB, 16-way.
l2=$(getconf LEVEL2_CACHE_SIZE 2>/dev/null || true)
assoc=$(getconf LEVEL2_CACHE_ASSOC 2>/dev/null || true)
case $l2 in '' | *[!0-9]* | 0) l2=2097152 ;; esac
case $assoc in '' | *[!0-9]* | 0) assoc=16 ;; esac
sets=$((l2 / (assoc * 64)))
if [ $((sets * assoc * 64)) -ne "$l2" ] || [ $((sets & (sets - 1))) -ne 0 ]; then
  echo "cachegrind.sh: L2 of $l2 B, $assoc-way cannot be simulated; using 2 MiB, 16-way" >&2
  l2=2097152
  assoc=16
fi

# valgrind 3.19 cannot run AVX-512 code: the avx2 kernels, or the scalar ones.
arch=avx2
FLASHATTN_ARCH=avx2 "$bin" info >/dev/null 2>&1 || arch=ref
export FLASHATTN_ARCH=$arch

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shape=(--batch 1 --heads 1 --seq "$n" --dim 128 --dtype f32 --threads 1)

# The model, and the tiles the library plans for this shape natively. Under
# valgrind the library would plan for the L2 valgrind's CPUID reports (256 KiB
# in 3.19), so the measured runs pin the native plan's tiles.
"$bin" bench --model-only --json "${shape[@]}" >"$tmp/model.json"
read -r tile_q tile_kv < <(python3 -c '
import json, sys
flash = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][0]
print(flash["tile_q"], flash["tile_kv"])' "$tmp/model.json")

# One cachegrind run of `flashattn bench ARGS...` into $tmp/NAME.out.
cg() {
  local name=$1
  shift
  valgrind --tool=cachegrind --cache-sim=yes --LL="$l2,$assoc,64" \
    --cachegrind-out-file="$tmp/$name.out" --log-file="$tmp/$name.log" \
    "$bin" bench "$@" >/dev/null
}

# Per algorithm: the same program twice, once stopping after the warm-up and
# the cache flush (--warmup-only), once going on to one timed call (--runs 1).
# Their difference is that one call, starting with none of its data in the L2.
# The two runs are independent, so they go side by side.
echo "cachegrind.sh: N=$n, FLASHATTN_ARCH=$arch, tiles ${tile_q}x$tile_kv, LL = $l2 B $assoc-way;" \
  "4 valgrind runs, this takes a while" >&2
for algo in flash standard; do
  common=(--algo "$algo" "${shape[@]}" --tile-q "$tile_q" --tile-kv "$tile_kv" --no-probe
    --cold="$((2 * l2))")
  cg "$algo-base" "${common[@]}" --warmup-only &
  base=$!
  cg "$algo-call" "${common[@]}" --runs 1 &
  call=$!
  wait "$base"
  wait "$call"
done

python3 - "$tmp" "$n" "$arch" "$l2" "$assoc" "$tile_q" "$tile_kv" <<'EOF'
import json, os, sys

tmp, n, arch, l2, assoc, tq, tkv = sys.argv[1:]
model = {o["algo"]: o for o in (json.loads(l) for l in open(os.path.join(tmp, "model.json")) if l.strip())}

def summary(name):
    """The whole-program event totals of one cachegrind output file."""
    events = totals = None
    for line in open(os.path.join(tmp, name + ".out")):
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            totals = [int(x) for x in line.split()[1:]]
    return dict(zip(events, totals))

def mib(b):
    return "%.2f MiB" % (b / 2**20)

def ratio(measured, modelled):
    return "%.2f" % (measured / modelled) if modelled else "-"

print("cachegrind: one head, B=1 H=1 Sq=Sk=%s D=128 f32, FLASHATTN_ARCH=%s, 1 thread, flash tiles %sx%s"
      % (n, arch, tq, tkv))
print("simulated LL = this machine's per-core L2: %s B, %s-way, 64 B lines (I1/D1 as valgrind detects them)"
      % (l2, assoc))
print("measured = (--runs 1) minus (--warmup-only): one forward call, after streaming %s through the cache"
      % mib(2 * int(l2)))
print("measured read = LL data read misses (DLmr) x 64; measured write miss = LL data write misses (DLmw) x 64.")
print("cachegrind counts no write-backs: compare the model's write misses (stores to lines not read first);")
print("its write-back column is what a real cache also writes out and cachegrind cannot see.")
print()
head = ["algo", "model read", "measured read", "ratio", "model write miss", "measured write miss",
        "ratio", "model write-back"]
rows = []
for algo in ("flash", "standard"):
    base, call = summary(algo + "-base"), summary(algo + "-call")
    rd = (call["DLmr"] - base["DLmr"]) * 64
    wr = (call["DLmw"] - base["DLmw"]) * 64
    m = model[algo]
    rows.append([algo, mib(m["read_bytes"]), mib(rd), ratio(rd, m["read_bytes"]),
                 mib(m["write_miss_bytes"]), mib(wr), ratio(wr, m["write_miss_bytes"]),
                 mib(m["write_bytes"])])
width = [max(len(r[c]) for r in rows + [head]) for c in range(len(head))]
for r in [head] + rows:
    print("  ".join(r[c].ljust(width[c]) if c == 0 else r[c].rjust(width[c]) for c in range(len(head))))
for algo in ("flash", "standard"):
    m = model[algo]
    if algo == "flash":
        print("model flash: K/V read %g time(s)%s" % (m["passes"], " (K/V stays in L2)" if m["resident"] else ""))
    else:
        print("model standard: S is %s; %s" % (mib(m["s_bytes"]),
              "fits in L2: no S traffic" if m["resident"] else "5 read and 4 write passes over it"))
EOF
