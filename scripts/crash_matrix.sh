#!/usr/bin/env bash
# The full crash matrix (tests/crash_matrix.cc; figures in tests/RELIABILITY.md): builds
# build-crash (RelWithDebInfo with the kill points compiled in; no Python, no benchmarks)
# and runs TRIALS trials (default 200). Extra arguments go to crash_matrix (--seed S,
# --keep to keep a failed trial's directories, ...). CI runs a short one under ASan
# (crash_matrix_short in `bash scripts/sanitize.sh asan`). Over a cluster of network
# namespaces with a GlusterFS volume and link cuts as a fault kind (root; issue 35):
#   bash scripts/crash_matrix.sh 60 --netns --volume --cuts 40
set -euo pipefail
cd "$(dirname "$0")/.."
trials="${1:-200}"
shift || true
bash scripts/setup.sh >/dev/null  # the packages
cmake -S . -B build-crash -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_WERROR=ON -DCAIRN_WITH_PYTHON=OFF \
  -DCAIRN_BUILD_BENCH=OFF -DCAIRN_KILL_POINTS=ON >/dev/null
cmake --build build-crash --target crash_matrix recovery_child
exec build-crash/tests/crash_matrix --trials "$trials" "$@"
