#!/usr/bin/env bash
# Builds the libFuzzer targets with clang-14 (ASan + UBSan), replays each target's corpus
# (fuzz/corpus/<target>: seeds and every past finding), then fuzzes each for SECONDS
# (default 30) on a scratch copy of the corpus. Exits non-zero on any crash; the input
# that crashed is left in build-fuzz/findings/ (add it to the corpus once fixed).
#   bash scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
bash scripts/setup.sh >/dev/null
missing=()
for p in clang-14 libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    "${missing[@]}" >/dev/null
fi
# FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION (libFuzzer's convention): wire/codec.cc skips its
# checksum, so that mutations reach the protobuf parser and the checks behind it.
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
flags+=" -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION"
CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_WERROR=ON \
  -DCAIRN_BUILD_FUZZ=ON -DCAIRN_BUILD_TESTS=OFF -DCAIRN_BUILD_BENCH=OFF -DCAIRN_WITH_PYTHON=OFF \
  -DCAIRN_WITH_CUDA=OFF -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
# cairn_cli too: with the fuzz targets (which link every module) it makes this the clang-14
# build of everything cairn ships with -Wthread-safety and warnings as errors, which CI
# no longer builds a second time in scripts/build_matrix.sh.
cmake --build build-fuzz --target fuzz_all cairn_cli
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no
export ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
mkdir -p build-fuzz/findings
status=0
for t in fuzz_slot_header fuzz_manifest fuzz_wire fuzz_flat_range fuzz_restore; do
  corpus="fuzz/corpus/$t"
  scratch="$(mktemp -d)"
  cp -r "$corpus/." "$scratch/"
  # Replay: every seed and past finding must pass.
  if ! "build-fuzz/fuzz/$t" -runs=0 "$corpus" >"build-fuzz/$t.replay.log" 2>&1; then
    echo "fuzz: $t: replaying $corpus failed (build-fuzz/$t.replay.log)"; status=1
  fi
  # Fuzz for a bounded time (new inputs go to the scratch copy, not the repository).
  if ! "build-fuzz/fuzz/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 \
      -artifact_prefix="build-fuzz/findings/$t-" "$scratch" >"build-fuzz/$t.log" 2>&1; then
    echo "fuzz: $t: FINDING (build-fuzz/$t.log, build-fuzz/findings/)"; status=1
  fi
  runs="$(grep -o 'Done [0-9]* runs' "build-fuzz/$t.log" | tail -1 | grep -o '[0-9]*' || true)"
  cov="$(grep -o 'cov: [0-9]*' "build-fuzz/$t.log" | tail -1 | grep -o '[0-9]*' || true)"
  echo "fuzz: $t: ${runs:-?} executions in ${seconds}s, coverage ${cov:-?}, corpus $(ls "$corpus" | wc -l) files replayed"
  rm -rf "$scratch"
done
exit "$status"
