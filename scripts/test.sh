#!/usr/bin/env bash
# Sets up and builds cairn, then runs the whole test suite in parallel.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir "${CAIRN_BUILD_DIR:-build}" -j "$(nproc)" --output-on-failure "$@"
