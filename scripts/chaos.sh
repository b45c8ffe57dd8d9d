#!/usr/bin/env bash
# The chaos run (tests/chaos.cc; figures in tests/RELIABILITY.md): the demo's training job,
# 2 nodes x 2 ranks in network namespaces of their own with a GlusterFS volume as the PFS,
# hit by a random fault every 30-90 s (node killed, node wiped, link cut, storage server
# killed) for SECONDS (default 600), restarted after each kill; every restore is checked
# against a replay. Prints goodput, recovery time per fault kind and the steps each fault
# cost. Needs root (namespaces), GlusterFS and /dev/fuse (scripts/setup.sh installs them).
#   bash scripts/chaos.sh [SECONDS] [--seed S] [--kinds kill,wipe,cut,storage] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
shift || true
bash scripts/setup.sh >/dev/null
build="${CAIRN_BUILD_DIR:-build}"
[[ -f $build/CMakeCache.txt ]] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target chaos cairn_cli
exec "$build/tests/chaos" --seconds "$seconds" "$@"
