#!/usr/bin/env bash
# Installs cairn's build dependencies from Debian (bookworm) when any is missing, then
# configures and builds cairn into build/ (RelWithDebInfo, warnings are errors).
#   bash scripts/setup.sh            everything: the library, the cairn command, the Python
#                                    module, the tests and the benchmarks, and the project's
#                                    Python environments (scripts/venv.sh: PyPI's PyTorch
#                                    of python/requirements.txt, and its oldest supported one)
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
  # PyTorch comes from PyPI into the project's venv (scripts/venv.sh), not from Debian.
  # python3-numpy: the independent reader of some C++ tests (cli_test: export, trace-merge).
  PACKAGES+=(libgtest-dev libgmock-dev libbenchmark-dev ucx-utils python3-dev python3-venv
             python3-numpy python3-pip pybind11-dev libpmix-dev openmpi-bin iproute2 gdb
             glusterfs-server glusterfs-client)
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
  # The Python module is built for the venv's interpreter, and the tests run on it; the
  # oldest supported PyTorch gets its own venv, for the tests that run on it too.
  # CAIRN_NO_TORCH=1: no venv (the module is built for /usr/bin/python3, without PyTorch).
  py=/usr/bin/python3
  oldest=""
  if [ "${CAIRN_NO_TORCH:-0}" != 1 ]; then
    py=$(bash scripts/venv.sh | tail -1)
    oldest=$(bash scripts/venv.sh --oldest | tail -1)
  fi
  # CAIRN_BUILD_TYPE: RelWithDebInfo unless set (CI's Debian 13 stage builds Release).
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${CAIRN_BUILD_TYPE:-RelWithDebInfo}" -DCAIRN_WERROR=ON \
    -DCAIRN_BUILD_TESTS=ON -DCAIRN_BUILD_BENCH=ON -DCAIRN_WITH_PYTHON=ON \
    -DPython_EXECUTABLE="$py" -DCAIRN_PYTHON_OLDEST="$oldest" >/dev/null
  cmake --build "$build"
fi
