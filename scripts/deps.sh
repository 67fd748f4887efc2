#!/usr/bin/env bash
# Installs what building and testing flashattn needs, from Debian's packages,
# when it is missing: a C compiler, CMake, pkg-config, python3 (for the CLI's
# JSON check). Prints nothing when everything is already there. Extra Debian package
# names as arguments are installed too (scripts/fuzz.sh: clang libclang-rt-14-dev,
# clang's libFuzzer and sanitizer runtimes on Debian 12).
set -euo pipefail
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v make >/dev/null 2>&1 || need+=(make)
command -v pkg-config >/dev/null 2>&1 || need+=(pkgconf)
command -v python3 >/dev/null 2>&1 || need+=(python3)
for pkg in "$@"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
echo "deps: installing ${need[*]}" >&2
sudo=; [ "$(id -u)" -ne 0 ] && sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
