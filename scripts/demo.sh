#!/usr/bin/env bash
# Installs what `cairn demo` needs, builds the cairn command, then runs `cairn demo`
# (arguments are passed on). scripts/test.sh builds and installs the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --demo
exec "${CAIRN_BUILD_DIR:-build}/cairn" demo "$@"
