# bench/tier.sh: sourced by the bench runners; `bench_tier TIER` sets one capability
# tier for both sides of a comparison, so that tiers compare on any machine:
#   flashattn: FLASHATTN_ARCH (its kernel table);
#   torch:     ATEN_CPU_CAPABILITY (ATen's kernels), ONEDNN_MAX_CPU_ISA (oneDNN),
#              MKL_ENABLE_INSTRUCTIONS (MKL).
# TIER: avx2, avx512 (flashattn's avx512bf16 table, oneDNN's AVX512_CORE_BF16, MKL's
# AVX512) or native (nothing set: each side picks its best). Prints the settings.
bench_tier() {
  case "$1" in
    avx2) export FLASHATTN_ARCH=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
    avx512) export FLASHATTN_ARCH=avx512bf16 ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 \
                   MKL_ENABLE_INSTRUCTIONS=AVX512 ;;
    native) ;;
    *) echo "bench: --tier takes avx2, avx512 or native, not '$1'" >&2; return 2 ;;
  esac
  echo "# tier $1: FLASHATTN_ARCH=${FLASHATTN_ARCH:-} ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-}" \
       "ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-} MKL_ENABLE_INSTRUCTIONS=${MKL_ENABLE_INSTRUCTIONS:-}" >&2
}

# Takes --tier T (or --tier=T) out of the arguments: sets it, and leaves the rest in
# the array bench_args.
bench_tier_args() {
  bench_args=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --tier) [ $# -ge 2 ] || { echo "bench: --tier needs a value" >&2; return 2; }
              bench_tier "$2" || return 2; shift 2 ;;
      --tier=*) bench_tier "${1#--tier=}" || return 2; shift ;;
      *) bench_args+=("$1"); shift ;;
    esac
  done
}
