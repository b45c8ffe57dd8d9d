#!/usr/bin/env bash
# Sets up and builds cairn, then runs `cairn demo` (arguments are passed on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${CAIRN_BUILD_DIR:-build}/cairn" demo "$@"
