#!/usr/bin/env bash
# The link-flap scenario in full (tests/link_flap_test.cc; CI runs it with a 3 s replicate
# timeout): two one-rank nodes in network namespaces of their own, UCX over tcp, a save
# every 100 ms, CAIRN_REPLICATE_TIMEOUT_S at its default of 30 s, node 1's switch port down
# for 15 s and 60 s, between pushes and during one. Prints, per cut, the time from the
# link's return to the first newly replicated version in each direction and the training
# stall during the cut; then node 1's memory is wiped and the job restores from its
# partner's replica. About 5 minutes. Needs root (network namespaces).
#   bash scripts/link_flap.sh [TIMEOUT_S]     (default 30)
#   CAIRN_FLAP_VERBOSE=1 also prints both ranks' logs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
CAIRN_FLAP_TIMEOUT_S="${1:-30}" CAIRN_REQUIRE_NETNS=1 \
  "${CAIRN_BUILD_DIR:-build}/tests/link_flap_test" --gtest_color=no
