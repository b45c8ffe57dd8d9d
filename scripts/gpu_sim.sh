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
if [ ! -e "$root/.cairn-sim-ready" ]; then
  echo "gpu_sim: making a Debian 13 root in $root"
  command -v debootstrap >/dev/null || {
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap >/dev/null
  }
  if grep -q " $root/" /proc/mounts; then
    echo "gpu_sim: something is still mounted under $root; unmount it first" >&2
    exit 2
  fi
  rm -rf "$root"
  mirror=$(grep -h "^URIs:" /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' |
           grep -v security | head -1)
  debootstrap --variant=minbase trixie "$root" "${mirror:-http://deb.debian.org/debian}" >/dev/null
  DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq --no-install-recommends \
    g++ cmake ninja-build python3-dev python3-pybind11 binutils >/dev/null
  touch "$root/.cairn-sim-ready"
fi
mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  rm -rf "$root/cairn"
}
trap cleanup EXIT
mount_at() {  # mount_at TARGET ARGS...
  local target="$1"
  shift
  mkdir -p "$target"
  mount "$@" "$target"
  mounted+=("$target")
}
mount_at "$root/proc" -t proc proc
mount_at "$root/sys" -t sysfs sys
mount_at "$root/dev" --bind /dev
mount_at "$root/dev/shm" --bind /dev/shm
mount_at "$root/usr/local/cuda" --bind -o ro /usr/local/cuda
rm -rf "$root/cairn"
mkdir -p "$root/cairn"
{ git ls-files; ls deps/gpu/*; } | tar -cf - -T - | tar -xf - -C "$root/cairn"
# The GPU suite (skips here) and the tests whose processes talk over UCX with the shipped
# libraries. The Python tests need PyTorch, which this root does not have.
chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  CAIRN_CTEST_ARGS="-R ^Gpu|TwoNodesReplicateTwentyVersionsBitExact/tcp|CollectivesDeliverEveryByte/n3_tcp|RestoresBitExactWithBlobs" \
  CAIRN_BENCH_BYTES=0 bash -c 'cd /cairn && bash scripts/gpu_test.sh'
echo "gpu_sim: scripts/gpu_test.sh built and ran from deps/gpu alone"
