#!/usr/bin/env bash
# Builds what cairn ships (libcairn.so, the static modules, the cairn command) in every
# build type with GCC, and with clang and its thread-safety analysis (-Wthread-safety on
# the CAIRN_GUARDED_BY annotations of core/mutex.h), warnings as errors. The tests run in
# the RelWithDebInfo build of scripts/test.sh; this script only proves the others build.
#   build_matrix.sh [TYPES...]   default: Debug Release RelWithDebInfo-clang
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang++-14 >/dev/null; then
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq clang-14 \
    >/dev/null
fi
types=("$@")
((${#types[@]})) || types=(Debug Release RelWithDebInfo-clang)
targets=(cairn_shared cairn cairn_cli)
for t in "${types[@]}"; do
  start=$SECONDS
  dir="build-${t,,}"
  args=(-G Ninja -DCAIRN_WERROR=ON -DCAIRN_BUILD_TESTS=OFF -DCAIRN_BUILD_BENCH=OFF
        -DCAIRN_WITH_PYTHON=OFF)
  case "$t" in
    *-clang) args+=(-DCMAKE_BUILD_TYPE="${t%-clang}" -DCMAKE_C_COMPILER=clang-14
                    -DCMAKE_CXX_COMPILER=clang++-14) ;;
    *) args+=(-DCMAKE_BUILD_TYPE="$t") ;;
  esac
  cmake -S . -B "$dir" "${args[@]}" >/dev/null
  cmake --build "$dir" --target "${targets[@]}"
  echo "build_matrix: $t built ($((SECONDS - start)) s)"
done
