#!/usr/bin/env bash
# Installs cairn's build dependencies from Debian (bookworm) when any is missing, then
# configures and builds cairn into build/ (RelWithDebInfo, warnings are errors).
#   bash scripts/setup.sh            everything: the library, the cairn command, the Python
#                                    module, the tests and the benchmarks
#   bash scripts/setup.sh --demo     only what `cairn demo` needs: fewer packages (no
#                                    PyTorch, GoogleTest, Open MPI, ...) and the cairn command
#   CAIRN_BUILD_DIR  build directory (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."

demo=0
if [ "${1:-}" = "--demo" ]; then demo=1; shift; fi
if (($#)); then echo "setup.sh: unknown argument '$1' (use --demo or nothing)" >&2; exit 2; fi

# What the library and the cairn command build against.
PACKAGES=(cmake ninja-build g++ pkg-config libpmem2-dev libxxhash-dev libisal-dev
          libprotobuf-dev protobuf-compiler libucx-dev libcli11-dev nlohmann-json3-dev)
if ((!demo)); then
  # The tests, benchmarks and Python module, and what the tests run (PMIx launchers, Open
  # MPI's mpirun, UCX's tools, network namespaces, GlusterFS as the namespace cluster's
  # networked PFS; gdb: a hung benchmark's native stacks).
  PACKAGES+=(libgtest-dev libgmock-dev libbenchmark-dev ucx-utils python3-numpy python3-dev
             pybind11-dev python3-torch libpmix-dev openmpi-bin iproute2 gdb
             glusterfs-server glusterfs-client)
  # `pip install .` (pyproject.toml, tests/pip_install_test.sh): scikit-build-core is in
  # Debian 13 on, not 12, where that test is skipped.
  if apt-cache show python3-scikit-build-core >/dev/null 2>&1; then
    PACKAGES+=(python3-scikit-build-core python3-pybind11 python3-venv python3-pip)
  fi
fi
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
if ((demo)); then
  # The tests, benchmarks and module stay as a build directory already has them (configured
  # by an earlier full setup), and are not built.
  if [ -f "$build/CMakeCache.txt" ]; then
    cmake -S . -B "$build" >/dev/null
  else
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_WERROR=ON \
      -DCAIRN_BUILD_TESTS=OFF -DCAIRN_BUILD_BENCH=OFF -DCAIRN_WITH_PYTHON=OFF >/dev/null
  fi
  cmake --build "$build" --target cairn_cli
else
  # CAIRN_BUILD_TYPE: RelWithDebInfo unless set (CI's Debian 13 stage builds Release).
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${CAIRN_BUILD_TYPE:-RelWithDebInfo}" -DCAIRN_WERROR=ON \
    -DCAIRN_BUILD_TESTS=ON -DCAIRN_BUILD_BENCH=ON -DCAIRN_WITH_PYTHON=ON >/dev/null
  cmake --build "$build"
fi
