#!/usr/bin/env bash
# Prepares, on a Debian 12 (bookworm) machine with apt, the folder of cairn's Debian
# dependencies that a GPU machine without a package registry builds cairn against
# (scripts/gpu_test.sh there). It holds the .deb files of the libraries, headers and tools
# cairn builds with (UCX, libpmem2, ISA-L, xxHash, protobuf with protoc, GoogleTest, pkgconf,
# pybind11 as a fallback) and, in DIR/fallback, of the libraries those load (numa, verbs,
# ndctl, kmod, ssl, lzma, zstd, udev, uuid): gpu_test.sh uses a fallback library only for a
# soname the GPU machine's loader cannot find, so the machine's own are never shadowed.
# None of the C and C++ runtimes (libc6, libstdc++6, libgcc-s1, zlib) is shipped: those
# come from the GPU machine, whose glibc must be at least Debian 12's (2.36). Nothing is
# built here.
#
#   bash scripts/gpu_deps.sh [DIR]     # default deps/gpu (ignored by git)
#
# DIR/PACKAGES lists what is in it; the script fails if DIR would exceed 48 MiB (the
# folder travels with the checkout, 64 MiB in all: a device call names it in `carry`).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-deps/gpu}"
PACKAGES=(
  # UCX and libpmem2
  libucx-dev libucx0 libpmem2-dev libpmem2
  # Intel ISA-L: the erasure codes of redundancy/erasure.h
  libisal-dev libisal2
  # xxHash, protobuf (MANIFEST) and protoc
  libxxhash-dev libxxhash0 libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32
  protobuf-compiler zlib1g-dev
  # the tests, pkg-config, and pybind11 for a machine whose Python has none
  libgtest-dev libgmock-dev googletest pkgconf pkgconf-bin libpkgconf3 pybind11-dev
  # header-only: CLI11 (command lines) and nlohmann-json (JSON)
  libcli11-dev nlohmann-json3-dev
)
# What the libraries above load (apt-cache depends), for a machine that lacks them.
FALLBACK=(
  libnuma1 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200  # UCX
  libndctl6 libdaxctl1 libkmod2 libudev1 libuuid1                # libpmem2
  libssl3 liblzma5 libzstd1                                      # libkmod2
)
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
if ! apt-cache show libucx-dev >/dev/null 2>&1; then
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
fi
rm -rf "$dir"
mkdir -p "$dir/fallback"
(cd "$dir" && apt-get -o APT::Sandbox::User=root download -q "${PACKAGES[@]}" >/dev/null)
(cd "$dir/fallback" && apt-get -o APT::Sandbox::User=root download -q "${FALLBACK[@]}" >/dev/null)
for f in "$dir"/*.deb "$dir"/fallback/*.deb; do
  dpkg-deb -W --showformat="\${Package} \${Version} ${f#"$dir"/}\n" "$f"
done >"$dir/PACKAGES"
size=$(du -sm "$dir" | cut -f1)
count=$(ls "$dir"/*.deb "$dir"/fallback/*.deb | wc -l)
echo "gpu_deps: $count packages, ${size} MiB in $dir"
if [ "$size" -gt 48 ]; then
  echo "gpu_deps: $dir is over 48 MiB" >&2
  exit 1
fi
