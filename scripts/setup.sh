#!/usr/bin/env bash
# Installs cairn's build dependencies from Debian (bookworm) when any is missing, then
# configures and builds cairn into build/ (RelWithDebInfo, warnings are errors).
#   CAIRN_BUILD_DIR  build directory (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake ninja-build g++ pkg-config libpmem2-dev libxxhash-dev
          libprotobuf-dev protobuf-compiler libgtest-dev libgmock-dev libbenchmark-dev
          libucx-dev ucx-utils python3-numpy python3-dev pybind11-dev python3-torch
          libcli11-dev nlohmann-json3-dev libpmix-dev openmpi-bin iproute2)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    "${missing[@]}" >/dev/null
fi

build="${CAIRN_BUILD_DIR:-build}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_WERROR=ON >/dev/null
cmake --build "$build"
