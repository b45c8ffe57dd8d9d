#!/usr/bin/env bash
# Prepares, on a Debian 12 (bookworm) machine with apt, the folder of cairn's Debian
# dependencies that a GPU machine without a package registry builds cairn against
# (scripts/gpu_test.sh there). It holds the .deb files of the libraries, headers and tools
# cairn builds with (UCX, libpmem2, xxHash, protobuf with protoc, GoogleTest, pkgconf,
# pybind11 as a fallback) and of the libraries they load, but none of the C and C++
# runtimes (libc6, libstdc++6, libgcc-s1, zlib): those come from the GPU machine, whose
# glibc must be at least Debian 12's (2.36). Nothing is built here.
#
#   bash scripts/gpu_deps.sh [DIR]     # default deps/gpu (ignored by git)
#
# DIR/PACKAGES lists what is in it; the script fails if DIR would exceed 48 MiB (the
# folder travels with the checkout, 64 MiB in all).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-deps/gpu}"
PACKAGES=(
  # UCX and what libucp/libuct load
  libucx-dev libucx0 libnuma1 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
  # libpmem2 and what it loads
  libpmem2-dev libpmem2 libndctl6 libdaxctl1 libkmod2
  # xxHash, protobuf (MANIFEST) and protoc
  libxxhash-dev libxxhash0 libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32
  protobuf-compiler zlib1g-dev
  # the tests, pkg-config, and pybind11 for a machine whose Python has none
  libgtest-dev libgmock-dev googletest pkgconf pkgconf-bin libpkgconf3 pybind11-dev
  # header-only: CLI11 (command lines) and nlohmann-json (JSON)
  libcli11-dev nlohmann-json3-dev
)
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
if ! apt-cache show libucx-dev >/dev/null 2>&1; then
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
fi
rm -rf "$dir"
mkdir -p "$dir"
(cd "$dir" && apt-get -o APT::Sandbox::User=root download -q "${PACKAGES[@]}" >/dev/null)
for f in "$dir"/*.deb; do dpkg-deb -W --showformat='${Package} ${Version}\n' "$f"; done >"$dir/PACKAGES"
size=$(du -sm "$dir" | cut -f1)
count=$(ls "$dir"/*.deb | wc -l)
echo "gpu_deps: $count packages, ${size} MiB in $dir"
if [ "$size" -gt 48 ]; then
  echo "gpu_deps: $dir is over 48 MiB" >&2
  exit 1
fi
