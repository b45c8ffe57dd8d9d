#!/usr/bin/env bash
# Sets up and builds cairn, then runs the whole test suite in parallel.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Under CI a test that fails is run once more (scripts/ctest_ci.sh says when and why).
bash scripts/ctest_ci.sh "${CAIRN_BUILD_DIR:-build}" -j "$(nproc)" --output-on-failure "$@"
