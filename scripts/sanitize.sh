#!/usr/bin/env bash
# Builds cairn with a sanitizer and runs its tests there.
#   bash scripts/sanitize.sh asan [CTEST_ARGS...]   AddressSanitizer + UndefinedBehaviorSanitizer
#   bash scripts/sanitize.sh tsan [CTEST_ARGS...]   ThreadSanitizer
# Build directories: build-asan, build-tsan (no Python module, no benchmarks). Without
# CTEST_ARGS every test runs; tests/RELIABILITY.md says which subset CI runs and why.
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:?usage: sanitize.sh asan|tsan [ctest args]}"
shift
# The ASan build also compiles the kill points, so ctest runs the short crash matrix
# (crash_matrix_short) there: every trial's processes under ASan + UBSan.
case "$kind" in
  asan) flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
        kill_points=ON ;;
  tsan) flags="-fsanitize=thread -fno-omit-frame-pointer"
        kill_points=OFF ;;
  *) echo "sanitize.sh: asan or tsan, not '$kind'" >&2; exit 2 ;;
esac
bash scripts/setup.sh >/dev/null  # the packages (and the normal build, which the tests share nothing with)
dir="build-$kind"
# GCC's -Wmaybe-uninitialized misfires under the sanitizers' instrumentation (std::regex,
# std::variant): warnings stay errors, that one is off here.
# -O1 -g1: quicker to build than -O2 -g, still fast enough to run and with line numbers.
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_WERROR=ON -DCAIRN_WITH_PYTHON=OFF \
  -DCAIRN_BUILD_BENCH=OFF -DCAIRN_KILL_POINTS="$kill_points" -DCMAKE_CXX_FLAGS="$flags -Wno-maybe-uninitialized" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$dir"
# UCX's malloc hooks and memory events fight the sanitizers' allocators.
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
bash scripts/ctest_ci.sh "$dir" --output-on-failure -j "$(nproc)" --timeout 900 "$@"
