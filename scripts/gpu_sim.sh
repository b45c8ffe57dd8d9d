#!/usr/bin/env bash
# Rehearses scripts/gpu_test.sh on this CPU machine, as a GPU machine without a package
# registry would run it: in a Debian 13 root (debootstrap, cached in CAIRN_SIM_ROOT between
# runs on one machine) that has only a C++ compiler, CMake, ninja and a Python virtual
# environment with pybind11 (no dpkg-deb is used: scripts/unpack_debs.py unpacks), the
# CUDA toolkit mounted read-only at /usr/local/cuda, and none of cairn's dependencies;
# cairn comes in as the tracked files plus deps/gpu (scripts/gpu_deps.sh), named by an
# absolute path. Runs the steps docs/gpu.md gives (preflight, build, test, bench), so the
# folder and the script are shown to carry everything the build needs and the shipped
# libraries to load and talk (UCX over tcp between processes); and parts. GPU tests skip here (no
# device), which is allowed on a machine without nvidia-smi; then, with a fake nvidia-smi
# on PATH, the same skipped tests must fail the run (the check that a GPU run in which
# nothing ran never reports success).
#
#   bash scripts/gpu_sim.sh          # root, Debian registry and /usr/local/cuda needed
set -euo pipefail
cd "$(dirname "$0")/.."
root="${CAIRN_SIM_ROOT:-/var/tmp/cairn-gpusim-root}"
if [ "$(id -u)" -ne 0 ]; then echo "gpu_sim: needs root (debootstrap, chroot, mounts)" >&2; exit 2; fi
if [ ! -d /usr/local/cuda/include ]; then echo "gpu_sim: no CUDA toolkit in /usr/local/cuda" >&2; exit 2; fi
[ -e deps/gpu/PACKAGES ] && [ -d deps/gpu/fallback ] || bash scripts/gpu_deps.sh
. scripts/trixie_root.sh
trixie_root_lock "$root"
trixie_root_make "$root" sim2 g++ cmake ninja-build python3-dev python3-venv python3-pybind11
trixie_root_mount "$root" cuda
trap 'trixie_root_unmount; rm -rf "$root/cairn"' EXIT
# The GPU machines' python3 is a virtual environment (/opt/torch/.venv).
[ -x "$root/opt/venv/bin/python3" ] ||
  chroot "$root" python3 -m venv --system-site-packages /opt/venv
rm -rf "$root/cairn"
mkdir -p "$root/cairn"
{ git ls-files; ls deps/gpu/PACKAGES deps/gpu/*.deb deps/gpu/fallback/*.deb; } |
  tar -cf - -T - | tar -xf - -C "$root/cairn"
sim() {  # runs gpu_test.sh in the root: sim EXTRA-PATH STEP... (environment from the caller)
  local extra="$1"
  shift
  chroot "$root" env -i PATH="${extra}/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin" HOME=/root \
    OUT=/cairn/out CAIRN_DEPS_DIR=/cairn/deps/gpu CAIRN_CALL_SECONDS=3600 \
    CAIRN_BUILD_TARGETS="$TARGETS" CAIRN_CTEST_ARGS="$CTEST_ARGS" \
    bash /cairn/scripts/gpu_test.sh "$@"
}
# The GPU suite (skips here) and the tests whose processes talk over UCX with the shipped
# libraries, and only what they need built (CI's time; the whole tree builds on Debian 13
# in scripts/debian13.sh). The Python tests need PyTorch, which this root does not have;
# the module is built all the same (a GPU machine's build step requires it). The parts
# step builds bench/gpu_parts and runs it (it reports no device here).
TARGETS="gpu_test checkpointer_test replication_test transport_test cairn_python bench_gpu_parts"
CTEST_ARGS="-R ^Gpu|TwoNodesReplicateTwentyVersionsBitExact/tcp|CollectivesDeliverEveryByte/n3_tcp|RestoresBitExactWithBlobs" \
  sim "" preflight build test bench parts
echo "gpu_sim: the steps built and ran from deps/gpu alone"

# A machine where nvidia-smi answers but the tests find no device: the skipped GPU tests
# must fail the test step, saying so.
mkdir -p "$root/opt/fakegpu"
cat >"$root/opt/fakegpu/nvidia-smi" <<'FAKE'
#!/bin/sh
echo "Rehearsal GPU (no device), 580.00, 81559 MiB, Default"
FAKE
chmod +x "$root/opt/fakegpu/nvidia-smi"
set +e
CTEST_ARGS="-R ^Gpu" sim /opt/fakegpu: build test >"$root/cairn/strict.log" 2>&1
rc=$?
set -e
if [ "$rc" = 0 ] || ! grep -q "no GPU test may skip" "$root/cairn/strict.log"; then
  cat "$root/cairn/strict.log"
  echo "gpu_sim: with nvidia-smi on PATH, skipped GPU tests did not fail the run (exit $rc)" >&2
  exit 1
fi
grep -E "tests: |skipped: " "$root/cairn/strict.log" | head -3
echo "gpu_sim: with nvidia-smi on PATH, the skipped GPU tests failed the run, as they must"
