#!/usr/bin/env bash
# The full form of RecoveryProcesses.KilledAtRandomMomentsTheJobRestoresOneStepFromMemory...
# (CI runs 3 trials): a 2 nodes x 2 ranks job (3 slots, a replica each, a drain every 4th
# version) is SIGKILLed at a random moment TRIALS times (default 50) and restarted; every
# trial must restore one step on every rank from memory, no older than the versions in
# flight allow. Prints each trial, then the distribution of the steps lost as one JSON line.
#   bash scripts/kill_trials.sh [TRIALS]
set -euo pipefail
cd "$(dirname "$0")/.."
trials="${1:-50}"
bash scripts/setup.sh >/dev/null
build="${CAIRN_BUILD_DIR:-build}"
CAIRN_TEST_KILL_TRIALS="$trials" "$build/tests/recovery_process_test" \
  --gtest_filter='RecoveryProcesses.KilledAtRandomMomentsTheJobRestoresOneStepFromMemoryLosingOnlyInFlight' \
  | grep -E '^(kill trial|\{|\[  (PASSED|FAILED))'
