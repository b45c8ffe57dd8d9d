#!/usr/bin/env bash
# On a GPU machine without a package registry (CUDA, a C++ compiler, CMake, ninja and a
# Python with PyTorch are there; cairn's Debian dependencies are not): unpacks the folder
# scripts/gpu_deps.sh made into build-gpu/deps, builds cairn against it (the Python module
# against this machine's python3 and its pybind11), then runs the GPU suite
# (`ctest -L gpu`: C++ tests, the PyTorch bf16 kill-and-resume test, a small bench) and
# bench/gpu_capture.py at CAIRN_BENCH_BYTES (default 8G).
#
#   bash scripts/gpu_test.sh [DEPS_DIR]     # default deps/gpu
#     CAIRN_GPU_ALL=1      also run the whole suite (ctest without -L)
#     CAIRN_CTEST_ARGS     other ctest arguments instead of "-L gpu" (scripts/gpu_sim.sh)
#     CAIRN_BENCH_BYTES=0  skip the full-size bench
#     OUT=dir              copies the logs and the bench's JSON line there
#
# Every step says what it does; the build is in build-gpu (a fresh one each time the
# folder changes). The environment it sets for cairn's binaries is in build-gpu/env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
deps="${1:-deps/gpu}"
build=build-gpu
prefix="$root/$build/deps"
if ! ls "$deps"/*.deb >/dev/null 2>&1; then
  echo "gpu_test: no .deb files in $deps: run scripts/gpu_deps.sh on a Debian machine first" >&2
  exit 2
fi

echo "gpu_test: unpacking $(ls "$deps"/*.deb | wc -l) packages into $prefix"
rm -rf "$prefix"
mkdir -p "$prefix"
for f in "$deps"/*.deb; do
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$f" "$prefix"
  else  # no dpkg: a .deb is an ar archive holding data.tar.*
    tmp=$(mktemp -d)
    (cd "$tmp" && ar x "$root/$f" && tar -xf data.tar.* -C "$prefix")
    rm -rf "$tmp"
  fi
done
lib="$prefix/usr/lib/x86_64-linux-gnu"
baselib="$prefix/lib/x86_64-linux-gnu"  # Debian 12 still ships some libraries in /lib
# The packages' pkg-config files name /usr: point them at the prefix.
for pc in "$lib"/pkgconfig/*.pc "$prefix"/usr/share/pkgconfig/*.pc; do
  [ -e "$pc" ] || continue
  sed -i -E "s#^([[:space:]]*(prefix|exec_prefix|libdir|includedir)[[:space:]]*=[[:space:]]*)/usr#\1$prefix/usr#" "$pc"
done
# Debian's pkgconf looks in /usr/lib/...; a host pkg-config is used when there is one.
cat >"$build/env.sh" <<ENV
export PATH="$prefix/usr/bin:\$PATH"
export LD_LIBRARY_PATH="$lib:$baselib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
ENV
# shellcheck source=/dev/null
. "$build/env.sh"
missing=$(for so in "$lib"/*.so.* "$baselib"/*.so.* "$prefix"/usr/bin/*; do
  [ -e "$so" ] && { ldd "$so" 2>/dev/null | grep "not found" || true; }
done | sort -u)
if [ -n "$missing" ]; then
  echo "gpu_test: libraries this machine lacks (add their packages to gpu_deps.sh):" >&2
  echo "$missing" >&2
  exit 2
fi

py=$(command -v python3)
cmake_args=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_WERROR=ON
            -DCMAKE_PREFIX_PATH="$prefix/usr" -DPython_EXECUTABLE="$py"
            -DCAIRN_BUILD_BENCH=OFF)
if pybind=$("$py" -m pybind11 --cmakedir 2>/dev/null); then
  cmake_args+=(-Dpybind11_DIR="$pybind")  # this Python's own pybind11
else
  cmake_args+=(-Dpybind11_DIR="$prefix/usr/lib/cmake/pybind11")
fi
if [ -x /usr/local/cuda/bin/nvcc ]; then cmake_args+=(-DCUDAToolkit_ROOT=/usr/local/cuda); fi
if nvidia-smi >/dev/null 2>&1; then cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES=native); fi
echo "gpu_test: configuring ($build)"
cmake "${cmake_args[@]}" >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
grep "cairn:" "$build/configure.log" || true
echo "gpu_test: building"
cmake --build "$build" -j "$(nproc)" >"$build/build.log" 2>&1 || { tail -50 "$build/build.log"; exit 1; }

out="${OUT:-}"
status=0
labels=(-L gpu)
if [ -n "${CAIRN_CTEST_ARGS:-}" ]; then read -r -a labels <<<"$CAIRN_CTEST_ARGS"; fi
if [ "${CAIRN_GPU_ALL:-0}" = 1 ]; then labels=(); fi
echo "gpu_test: ctest ${labels[*]}"
set +e
ctest --test-dir "$build" "${labels[@]}" --output-on-failure -j 2 2>&1 | tee "$build/ctest.log"
status=${PIPESTATUS[0]}
bytes="${CAIRN_BENCH_BYTES:-8G}"
if [ "$bytes" != 0 ]; then
  echo "gpu_test: bench/gpu_capture.py --bytes $bytes"
  PYTHONPATH="$build/python" "$py" bench/gpu_capture.py --bytes "$bytes" 2>&1 |
    tee "$build/gpu_capture.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
set -e
if [ -n "$out" ]; then
  cp "$build"/configure.log "$build"/ctest.log "$out"/ 2>/dev/null || true
  [ -e "$build/gpu_capture.log" ] && cp "$build/gpu_capture.log" "$out"/
fi
exit "$status"
