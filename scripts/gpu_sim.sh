#!/usr/bin/env bash
# Rehearses scripts/gpu_test.sh on this CPU machine, as a GPU machine without a package
# registry would run it: in a Debian 13 root (debootstrap, cached in CAIRN_SIM_ROOT between
# runs on one machine) that has only a C++ compiler, CMake, ninja and Python with pybind11,
# the CUDA toolkit mounted read-only at /usr/local/cuda, and none of cairn's dependencies;
# cairn comes in as the tracked files plus deps/gpu (scripts/gpu_deps.sh). Proves that the
# folder and the script carry everything the build needs, and that the shipped libraries
# load and talk (UCX over tcp between processes). GPU tests skip here (no device).
#
#   bash scripts/gpu_sim.sh          # root, Debian registry and /usr/local/cuda needed
set -euo pipefail
cd "$(dirname "$0")/.."
root="${CAIRN_SIM_ROOT:-/var/tmp/cairn-gpusim-root}"
if [ "$(id -u)" -ne 0 ]; then echo "gpu_sim: needs root (debootstrap, chroot, mounts)" >&2; exit 2; fi
if [ ! -d /usr/local/cuda/include ]; then echo "gpu_sim: no CUDA toolkit in /usr/local/cuda" >&2; exit 2; fi
[ -e deps/gpu/PACKAGES ] || bash scripts/gpu_deps.sh
. scripts/trixie_root.sh
trixie_root_lock "$root"
trixie_root_make "$root" sim g++ cmake ninja-build python3-dev python3-pybind11 binutils
trixie_root_mount "$root" cuda
trap 'trixie_root_unmount; rm -rf "$root/cairn"' EXIT
rm -rf "$root/cairn"
mkdir -p "$root/cairn"
{ git ls-files; ls deps/gpu/*; } | tar -cf - -T - | tar -xf - -C "$root/cairn"
# The GPU suite (skips here) and the tests whose processes talk over UCX with the shipped
# libraries. The Python tests need PyTorch, which this root does not have.
chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  CAIRN_CTEST_ARGS="-R ^Gpu|TwoNodesReplicateTwentyVersionsBitExact/tcp|CollectivesDeliverEveryByte/n3_tcp|RestoresBitExactWithBlobs" \
  CAIRN_BENCH_BYTES=0 bash -c 'cd /cairn && bash scripts/gpu_test.sh'
echo "gpu_sim: scripts/gpu_test.sh built and ran from deps/gpu alone"
