#!/usr/bin/env bash
# The installed package as a user meets it: `cmake --install` of the build tree into a
# temporary prefix, then a program (tests/consumer) built against that prefix alone, once
# with find_package(cairn CONFIG) and once with pkg-config, run, its restored bytes
# checked; and the public headers checked for internal dependencies.
#   install_test.sh BUILD_DIR SOURCE_DIR [CXXFLAGS [LDFLAGS]]
# CXXFLAGS/LDFLAGS: the build's own (a sanitizer build's library needs a consumer built
# with the same sanitizer).
set -euo pipefail
build=$1
src=$2
cxxflags=${3:-}
ldflags=${4:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cairn-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
inc="$tmp/prefix/include/cairn"
test -f "$inc/checkpointer.h"
# The public headers pull in no UCX, libpmem2, protobuf, CUDA, thread or internal header.
if grep -nE '#include *[<"](ucp/|uct/|ucs/|libpmem2|google/protobuf|cuda|thread>|mutex>|condition_variable>|core/|tiers/|snapshot/|transport/|persist/|recovery/|api/)' "$inc"/*.h; then
  echo "install_test: a public header includes an internal dependency (above)" >&2
  exit 1
fi
# Every public header compiles on its own with nothing but the installed include dir.
for h in "$inc"/*.h; do
  echo "#include \"cairn/$(basename "$h")\"" > "$tmp/one.cc"
  c++ -std=c++20 -fsyntax-only -I"$tmp/prefix/include" "$tmp/one.cc"
done
# 1. CMake package.
cmake -S "$src/tests/consumer" -B "$tmp/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_CXX_FLAGS="$cxxflags" \
  -DCMAKE_EXE_LINKER_FLAGS="$ldflags" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
run() {
  local job="install-test-$$-$1"
  "$2" "$tmp/host" "$tmp/pfs" "$job"
}
run cmake "$tmp/consumer/consumer"
# 2. pkg-config.
libdir=$(ls -d "$tmp/prefix"/lib*/pkgconfig | head -1)
export PKG_CONFIG_PATH="$libdir"
# shellcheck disable=SC2046,SC2086
c++ $cxxflags $ldflags -o "$tmp/consumer-pc" "$src/tests/consumer/main.cc" \
  $(pkg-config --cflags --libs cairn) \
  -Wl,-rpath,"$(pkg-config --variable=libdir cairn)"
run pkgconfig "$tmp/consumer-pc"
# The library keeps the internal modules' symbols to itself.
so=$(ls "$(pkg-config --variable=libdir cairn)"/libcairn.so | head -1)
if nm -DC --defined-only "$so" | grep -E ' [TW] cairn::(UcxComm|UcxGroup|HostTier|Persister|Replicator|ReplicaStore)::'; then
  echo "install_test: libcairn.so exports internal symbols" >&2
  exit 1
fi
echo "install_test: ok"
