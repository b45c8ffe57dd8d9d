#!/usr/bin/env bash
# The GPU run, on a GPU machine without a package registry (CUDA, a C++ compiler, CMake,
# ninja and a Python with PyTorch are there; cairn's Debian dependencies come as the
# folder scripts/gpu_deps.sh makes on a Debian 12 machine, deps/gpu, carried along). In
# steps that each fit one call of a lent machine (10 minutes), each writing its log into
# $OUT as it goes, so that a call cut off at its limit still brings back what ran.
# docs/gpu.md gives the calls, one per line.
#
#   bash scripts/gpu_test.sh STEP...     # run in the order given
#     preflight  (seconds) what the run depends on: space in /dev/shm, /var/tmp and the
#                tree; compiler, CMake, ninja, nvcc, Python, pybind11 and torch versions;
#                Python.h; torch.cuda; the GPU's compute mode; deps/gpu unpacked and the
#                libraries it needs found (a fallback library only where the machine lacks
#                the soname)
#     build      unpacks deps/gpu, configures build-gpu (once) and builds it (incremental:
#                seconds when built; a machine given back between calls starts bare)
#     test       build, then the GPU suite: ctest -L gpu -V, stopped before the call's end
#     bench      build, then bench/gpu_capture.py --bytes $CAIRN_BENCH_BYTES, its rounds
#                sized to what is left of the call
#     parts      build, then bench/gpu_parts --bytes $CAIRN_BENCH_BYTES $CAIRN_PARTS_ARGS:
#                where a capture loses time against the raw copy, part by part
#     all        preflight, test and bench (by hand; more than one device call holds)
#
#   OUT                  where the logs go (default build-gpu/logs); a device call's $OUT
#   CAIRN_DEPS_DIR       the dependency folder (default deps/gpu)
#   CAIRN_CTEST_ARGS     ctest's selection instead of "-L gpu" (scripts/gpu_sim.sh)
#   CAIRN_BUILD_TARGETS  build only these targets (scripts/gpu_sim.sh; default: all)
#   CAIRN_BENCH_BYTES    the bench's state (default 8G)
#   CAIRN_BENCH_ARGS     more arguments for bench/gpu_capture.py (e.g. --no-dcp --rounds 2)
#   CAIRN_BENCH_TAG      names the bench step's files bench-<tag>.log/.json (A/B runs)
#   CAIRN_PARTS_ARGS     more arguments for bench/gpu_parts (e.g. --threads 8,16)
#   CAIRN_CALL_SECONDS   the call's limit the steps fit into (default 600)
#   CAIRN_CTEST_JOBS     tests run at once by the test step (default 2)
#   CAIRN_GPU_REQUIRED   1 (the default where nvidia-smi is on PATH): a GPU machine, where
#                        a run in which nothing ran must fail: preflight fails if
#                        nvidia-smi, Python.h or CUDA in torch is missing; build fails if
#                        configure found no CUDA, nvcc or Python; test fails if any test
#                        was skipped or none ran. 0: a rehearsal (scripts/gpu_sim.sh).
#
# Warnings are not errors here (a compiler, pybind11 and CMake CI never ran); the CUDA
# architecture is 90 (H100, H200) unless CMAKE_CUDA_ARCHITECTURES is set.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
began=$SECONDS
build="$root/build-gpu"
deps="${CAIRN_DEPS_DIR:-deps/gpu}"
case "$deps" in /*) ;; *) deps="$root/$deps" ;; esac
prefix="$build/deps"          # the packages cairn builds against
fallback="$build/deps-fallback"  # libraries they load, for sonames the machine lacks
fallback_lib="$build/deps-fallback-lib"  # links to those the loader needed
lib="$prefix/usr/lib/x86_64-linux-gnu"
baselib="$prefix/lib/x86_64-linux-gnu"  # Debian 12 still ships some libraries in /lib
out="${OUT:-$build/logs}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
call_s="${CAIRN_CALL_SECONDS:-600}"
bytes="${CAIRN_BENCH_BYTES:-8G}"
strict="${CAIRN_GPU_REQUIRED:-}"
if [ -z "$strict" ]; then
  if command -v nvidia-smi >/dev/null; then strict=1; else strict=0; fi
fi
py=$(command -v python3 || true)
step=gpu_test

say() { echo "gpu_test $step: $*" | tee -a "$out/$step.log"; }
fail() {
  echo "gpu_test $step: FAILED: $*" | tee -a "$out/$step.log" >&2
  exit 1
}
elapsed() { echo $((SECONDS - began)); }
gib() { df -B1 --output=avail "$1" 2>/dev/null | tail -1 | awk '{printf "%.1f", $1 / 2^30}'; }
bytes_of() {  # 8G -> bytes
  local v="${1^^}"
  v="${v%B}"
  case "$v" in
    *K) echo $((${v%K} << 10)) ;; *M) echo $((${v%M} << 20)) ;; *G) echo $((${v%G} << 30)) ;;
    *) echo "$v" ;;
  esac
}

# deps/gpu -> $prefix (and $fallback), the .pc files pointed at it, env.sh written, and
# the fallback libraries linked for every soname the loader cannot find. Once per folder.
unpack_deps() {
  if ! ls "$deps"/*.deb >/dev/null 2>&1; then
    fail "no .deb files in $deps: run scripts/gpu_deps.sh on a Debian 12 machine and carry deps/gpu along (docs/gpu.md)"
  fi
  local key
  key=$(cat "$deps/PACKAGES" 2>/dev/null; ls -l "$deps" "$deps/fallback" 2>/dev/null)
  if [ -e "$prefix/.unpacked" ] && [ "$(cat "$prefix/.unpacked")" = "$key" ]; then
    # shellcheck source=/dev/null
    . "$build/env.sh"
    return 0
  fi
  local n
  n=$(ls "$deps"/*.deb "$deps"/fallback/*.deb 2>/dev/null | wc -l)
  say "unpacking $n packages from $deps"
  rm -rf "$prefix" "$fallback" "$fallback_lib"
  mkdir -p "$prefix" "$fallback" "$fallback_lib"
  "$py" "$root/scripts/unpack_debs.py" "$prefix" "$deps"/*.deb | tee -a "$out/$step.log"
  if ls "$deps"/fallback/*.deb >/dev/null 2>&1; then
    "$py" "$root/scripts/unpack_debs.py" "$fallback" "$deps"/fallback/*.deb | tee -a "$out/$step.log"
  fi
  # The packages' pkg-config files name /usr: point them at the prefix.
  local pc
  for pc in "$lib"/pkgconfig/*.pc "$prefix"/usr/share/pkgconfig/*.pc; do
    [ -e "$pc" ] || continue
    sed -i -E "s#^([[:space:]]*(prefix|exec_prefix|libdir|includedir)[[:space:]]*=[[:space:]]*)/usr#\1$prefix/usr#" "$pc"
  done
  cat >"$build/env.sh" <<ENV
export PATH="$prefix/usr/bin:\$PATH"
export LD_LIBRARY_PATH="$lib:$baselib:$fallback_lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
ENV
  # shellcheck source=/dev/null
  . "$build/env.sh"
  link_fallbacks
  echo "$key" >"$prefix/.unpacked"
}

# Sonames the shipped libraries and programs need that the loader cannot find: each is
# linked from the fallback folder, until none is missing (else the step fails, naming
# them). UCX's transport modules (lib/ucx) get the same, but one that still lacks a
# library (InfiniBand hardware providers, another module UCX loads first) is only
# reported: UCX skips a module it cannot load, and its tcp and shared-memory transports
# need none.
link_fallbacks() {
  command -v ldd >/dev/null || fail "no ldd on this machine: cannot check the shipped libraries"
  needs() {  # FILE...: the sonames they need that the loader cannot find
    local f
    for f in "$@"; do
      if [ -f "$f" ]; then ldd "$f" 2>/dev/null | awk '/=> not found/ {print $1}' || true; fi
    done | sort -u
  }
  local round so found used=() unresolved=() optional=()
  for round in 1 2 3 4 5 6; do
    local missing modules
    missing=$(needs "$lib"/*.so.* "$baselib"/*.so.* "$prefix"/usr/bin/* "$fallback_lib"/*)
    modules=$(needs "$lib"/ucx/*.so*)
    unresolved=()
    optional=()
    local linked=0
    for so in $missing $modules; do
      found=$(find "$fallback" -name "$so" \( -type f -o -type l \) | head -1)
      if [ -n "$found" ]; then
        ln -sf "$found" "$fallback_lib/$so"
        used+=("$so")
        linked=1
      elif grep -qx "$so" <<<"$missing"; then
        unresolved+=("$so")
      elif [ ! -e "$lib/ucx/$so" ]; then
        optional+=("$so")
      fi
    done
    if ((${#unresolved[@]})); then
      fail "libraries this machine lacks and deps/gpu does not ship (add their packages to scripts/gpu_deps.sh): $(printf '%s\n' "${unresolved[@]}" | sort -u | tr '\n' ' ')"
    fi
    ((linked)) || break
  done
  if ((${#used[@]})); then
    say "fallback libraries used (this machine lacks them): $(printf '%s\n' "${used[@]}" | sort -u | tr '\n' ' ')"
  else
    say "fallback libraries used: none (the machine has every soname)"
  fi
  if ((${#optional[@]})); then
    say "UCX modules that will not load here (UCX skips them): they lack $(printf '%s\n' "${optional[@]}" | sort -u | tr '\n' ' ')"
  fi
}

do_preflight() {
  step=preflight
  : >"$out/$step.log"
  local problems=() notes=() v
  say "$(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(uname -n), kernel $(uname -r), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 2^20}' /proc/meminfo) memory, strict=$strict"
  if command -v nvidia-smi >/dev/null; then
    if v=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader 2>&1); then
      say "GPU: $v"
      case "$v" in
        *Default*) ;;
        *) notes+=("compute mode is not Default ($v): GpuProcesses.* and the PyTorch kill-and-resume test start several processes on the GPU and will fail") ;;
      esac
    else
      problems+=("nvidia-smi fails: $v")
    fi
  else
    [ "$strict" = 1 ] && problems+=("no nvidia-smi on PATH")
    say "GPU: no nvidia-smi (not a GPU machine)"
  fi
  local shm_need tmp_need
  shm_need=$(( $(bytes_of "$bytes") * 42 / 10 / (1 << 30) + 2 ))  # 3 slots + DCP staging
  tmp_need=$(( $(bytes_of "$bytes") * 12 / 10 / (1 << 30) + 3 ))  # DCP's files + the build
  say "free: /dev/shm $(gib /dev/shm) GiB (the bench at $bytes needs ~$shm_need), /var/tmp $(gib /var/tmp) GiB, the tree $(gib "$root") GiB (~$tmp_need for the bench's DCP files and the build)"
  # Only the bench needs that much (it checks again itself): a note, not a stop.
  awk -v f="$(gib /dev/shm)" -v n="$shm_need" 'BEGIN {exit !(f < n)}' &&
    notes+=("/dev/shm has $(gib /dev/shm) GiB free, the bench at $bytes needs ~$shm_need: run the bench step with CAIRN_BENCH_BYTES=$(awk -v f="$(gib /dev/shm)" 'BEGIN {printf "%d", (f - 2) / 4.2}')G")
  awk -v f="$(gib /var/tmp)" -v n="$tmp_need" 'BEGIN {exit !(f < n)}' &&
    notes+=("/var/tmp has $(gib /var/tmp) GiB free, the bench at $bytes and the build need ~$tmp_need")
  awk -v f="$(gib /dev/shm)" 'BEGIN {exit !(f < 4)}' &&
    problems+=("/dev/shm has only $(gib /dev/shm) GiB free; the GPU tests need about 4")
  for t in c++ cmake ninja; do
    if command -v "$t" >/dev/null; then say "$t: $("$t" --version 2>&1 | head -1)"; else problems+=("no $t on PATH"); fi
  done
  local nvcc=/usr/local/cuda/bin/nvcc
  command -v nvcc >/dev/null && nvcc=$(command -v nvcc)
  if [ -x "$nvcc" ]; then say "nvcc: $("$nvcc" --version | tail -2 | head -1)"; else
    [ "$strict" = 1 ] && problems+=("no nvcc (the GPU tests' kernels need it)")
    say "nvcc: none"
  fi
  if [ -z "$py" ]; then
    problems+=("no python3 on PATH")
  else
    say "python: $py, $("$py" -c 'import sys; print(sys.version.split()[0], "(venv)" if sys.prefix != sys.base_prefix else "")')"
    v=$("$py" -c 'import sysconfig, os; h = os.path.join(sysconfig.get_paths()["include"], "Python.h"); print(h if os.path.exists(h) else "MISSING " + h)')
    say "Python.h: $v"
    case "$v" in MISSING*) problems+=("no Python.h ($v): the Python module would not be built") ;; esac
    say "pybind11: $("$py" -m pybind11 --version 2>/dev/null || echo "not in this Python (deps/gpu has 2.10 as a fallback)")"
    "$py" -c 'import lzma' 2>/dev/null || problems+=("this Python has no lzma module: deps/gpu cannot be unpacked")
    v=$("$py" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tail -1) || true
    say "torch: $v"
    case "$v" in
      *"available True"*) ;;
      *) [ "$strict" = 1 ] && problems+=("torch.cuda is not available ($v)") ;;
    esac
  fi
  unpack_deps
  for n in "${notes[@]}"; do say "WARNING: $n"; done
  if ((${#problems[@]})); then
    for p in "${problems[@]}"; do say "problem: $p"; done
    [ "$strict" = 1 ] && fail "${#problems[@]} problem(s) above"
    say "(not a GPU machine: the problems above are notes)"
  fi
  say "done in $(elapsed) s"
}

do_build() {
  step=build
  [ -e "$out/$step.log" ] || : >"$out/$step.log"
  unpack_deps
  if [ ! -e "$build/CMakeCache.txt" ]; then
    local cmake_args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
                      -DCMAKE_PREFIX_PATH="$prefix/usr" -DPython_EXECUTABLE="$py")
    local pybind
    if pybind=$("$py" -m pybind11 --cmakedir 2>/dev/null); then
      cmake_args+=(-Dpybind11_DIR="$pybind")  # this Python's own pybind11
    else
      cmake_args+=(-Dpybind11_DIR="$prefix/usr/lib/cmake/pybind11")
    fi
    if [ -x /usr/local/cuda/bin/nvcc ]; then cmake_args+=(-DCUDAToolkit_ROOT=/usr/local/cuda); fi
    say "configuring $build"
    if ! cmake "${cmake_args[@]}" >"$build/configure.log" 2>&1; then
      cat "$build/configure.log" >>"$out/$step.log"
      tail -40 "$build/configure.log"
      rm -f "$build/CMakeCache.txt"
      fail "configure failed (the whole log is in $step.log)"
    fi
    cat "$build/configure.log" >>"$out/$step.log"
  fi
  local summary
  summary=$(grep -h "cairn: summary:" "$build/configure.log" | tail -1)
  say "${summary#-- }"
  if [ "$strict" = 1 ]; then
    [ -n "$summary" ] || fail "configure.log has no 'cairn: summary:' line (a build-gpu from older sources? remove it)"
    case "$summary" in *cuda=off*) fail "configure found no CUDA toolkit on a GPU machine (CUDAToolkit_ROOT?)" ;; esac
    case "$summary" in *kernels=off*) fail "configure found no nvcc: the GPU tests would be built without their kernels and skip" ;; esac
    case "$summary" in *python=off*) fail "configure found no Python headers or pybind11 for $py: the Python GPU tests and the bench need the module" ;; esac
  fi
  local t0=$SECONDS targets=()
  if [ -n "${CAIRN_BUILD_TARGETS:-}" ]; then read -r -a targets <<<"--target $CAIRN_BUILD_TARGETS"; fi
  say "building ${CAIRN_BUILD_TARGETS:-everything} ($(nproc) jobs)"
  if ! cmake --build "$build" -j "$(nproc)" "${targets[@]}" >>"$out/$step.log" 2>&1; then
    grep -E "error|FAILED" "$out/$step.log" | head -20
    fail "the build failed (the whole log is in $step.log)"
  fi
  # (Only where it was asked for: a parts-only call builds bench_gpu_parts alone.)
  local wants_module=1
  if [ -n "${CAIRN_BUILD_TARGETS:-}" ] && ! grep -qw cairn_python <<<"$CAIRN_BUILD_TARGETS"; then
    wants_module=0
  fi
  if [ "$strict" = 1 ] && [ "$wants_module" = 1 ] && ! ls "$build"/python/cairn/_cairn*.so >/dev/null 2>&1; then
    fail "the Python module was not built ($build/python/cairn/_cairn*.so)"
  fi
  say "built in $((SECONDS - t0)) s"
}

do_test() {
  do_build
  step=test
  : >"$out/$step.log"
  local labels=(-L gpu)
  if [ -n "${CAIRN_CTEST_ARGS:-}" ]; then read -r -a labels <<<"$CAIRN_CTEST_ARGS"; fi
  # The suite ends well inside the call: ctest stops starting tests and ends the running
  # ones at --stop-time (each test's own timeout is 300 s at most).
  # The tests' ranks keep their host slots there (a few GiB in all).
  awk -v f="$(gib /dev/shm)" 'BEGIN {exit !(f < 4)}' &&
    fail "/dev/shm has only $(gib /dev/shm) GiB free; the GPU tests need about 4"
  local left=$((call_s - $(elapsed) - 45))
  ((left > 60)) || fail "only $left s left in this call: run the test step in a call of its own"
  local stop
  stop=$(date -d "@$(($(date +%s) + left))" +%H:%M:%S)
  say "ctest ${labels[*]} -V (free: /dev/shm $(gib /dev/shm) GiB; stops at $stop, in $left s)"
  set +e
  ctest --test-dir "$build" "${labels[@]}" -V -j "${CAIRN_CTEST_JOBS:-2}" --stop-time "$stop" \
    --output-junit "$out/ctest.xml" 2>&1 | tee "$out/ctest.log"
  local rc=${PIPESTATUS[0]}
  # What ran, from ctest's JUnit report: a test reported as skipped did nothing.
  "$py" - "$out/ctest.xml" "$strict" <<'PY' | tee -a "$out/$step.log"
import sys
import xml.etree.ElementTree as ET

path, strict = sys.argv[1], sys.argv[2] == "1"
try:
    cases = ET.parse(path).getroot().iter("testcase")
except (OSError, ET.ParseError) as e:
    print(f"no JUnit report ({e})")
    sys.exit(1)
by = {}
for c in cases:
    status = c.get("status", "run")  # run, fail, notrun (stopped, missing), disabled
    if c.find("skipped") is not None:  # ctest's SKIP_REGULAR_EXPRESSION, a GTEST_SKIP()
        status = "skipped"
    if c.find("failure") is not None:
        status = "fail"
    by.setdefault(status, []).append(c.get("name"))
ran = len(by.get("run", []))
print("tests: " + ", ".join(f"{k} {len(v)}" for k, v in sorted(by.items())))
for k, v in sorted(by.items()):
    if k != "run":
        print(f"  {k}: " + " ".join(v))
bad = by.get("fail", [])
if strict:
    bad += by.get("skipped", []) + by.get("notrun", []) + by.get("disabled", [])
    if not ran:
        print("no test ran")
        sys.exit(1)
sys.exit(1 if bad else 0)
PY
  local verdict=${PIPESTATUS[0]}
  set -e
  [ "$rc" = 0 ] || fail "ctest failed (exit $rc; ctest.log)"
  if [ "$verdict" != 0 ]; then
    [ "$strict" = 1 ] && fail "on a GPU machine no GPU test may skip or fail (CAIRN_GPU_REQUIRED=1): see the list above"
    fail "the JUnit report says tests failed"
  fi
  say "passed in $(elapsed) s since the call began"
}

do_bench() {
  do_build
  step=bench${CAIRN_BENCH_TAG:+-$CAIRN_BENCH_TAG}
  : >"$out/$step.log"
  if ! "$py" -c 'import torch' 2>/dev/null; then
    [ "$strict" = 1 ] && fail "$py has no torch"
    say "skipped: $py has no torch (a rehearsal)"
    return 0
  fi
  local left=$((call_s - $(elapsed) - 60))
  ((left > 120)) || fail "only $left s left in this call: run the bench step in a call of its own"
  say "bench/gpu_capture.py --bytes $bytes --max-seconds $left ${CAIRN_BENCH_ARGS:-}${CAIRN_CUDA_COPY_WINDOW:+ (CAIRN_CUDA_COPY_WINDOW=$CAIRN_CUDA_COPY_WINDOW)}"
  set +e
  # shellcheck disable=SC2086
  PYTHONPATH="$build/python" PYTHONUNBUFFERED=1 "$py" "$root/bench/gpu_capture.py" \
    --bytes "$bytes" --max-seconds "$left" ${CAIRN_BENCH_ARGS:-} 2>&1 | tee -a "$out/$step.log"
  local rc=${PIPESTATUS[0]}
  set -e
  tail -1 "$out/$step.log" >"$out/$step.json"
  [ "$rc" = 0 ] || fail "the bench failed (exit $rc)"
  if [ "$strict" = 1 ] && grep -q '"skipped": "no CUDA device"' "$out/$step.json"; then
    fail "the bench found no CUDA device on a GPU machine"
  fi
  say "done in $(elapsed) s since the call began"
}

# bench/gpu_parts: the capture taken apart (raw copies into each kind of pinned memory,
# chunk events, the engine with 4 to 16 checksum threads, checksums alone). As root, a
# tmpfs mounted huge=always adds the huge-page slot arm; it is unmounted afterwards.
do_parts() {
  do_build
  step=parts
  : >"$out/$step.log"
  say "building bench_gpu_parts"
  cmake --build "$build" -j "$(nproc)" --target bench_gpu_parts >>"$out/$step.log" 2>&1 ||
    fail "bench_gpu_parts did not build ($step.log)"
  local args=(--bytes "$bytes") huge=""
  if [ "$(id -u)" = 0 ] && huge=$(mktemp -d /tmp/cairn-huge.XXXXXX) &&
    mount -t tmpfs -o "size=$(($(bytes_of "$bytes") * 2)),huge=always" cairn-huge "$huge" 2>>"$out/$step.log"; then
    args+=(--huge-root "$huge")
  else
    [ -n "$huge" ] && rmdir "$huge" 2>/dev/null
    huge=""
  fi
  say "shmem THP: $(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null), anon THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
  say "bench/gpu_parts ${args[*]} ${CAIRN_PARTS_ARGS:-}"
  set +e
  # shellcheck disable=SC2086
  "$build/bench/gpu_parts" "${args[@]}" ${CAIRN_PARTS_ARGS:-} 2>&1 | tee -a "$out/$step.log"
  local rc=${PIPESTATUS[0]}
  set -e
  if [ -n "$huge" ]; then umount -l "$huge" && rmdir "$huge"; fi
  tail -1 "$out/$step.log" >"$out/parts.json"
  [ "$rc" = 0 ] || fail "gpu_parts failed (exit $rc)"
  if [ "$strict" = 1 ] && grep -q '"skipped": "no CUDA device"' "$out/parts.json"; then
    fail "gpu_parts found no CUDA device on a GPU machine"
  fi
  say "done in $(elapsed) s since the call began"
}

(($#)) || { sed -n '2,41p' "$0"; exit 2; }
for s in "$@"; do
  case "$s" in
    preflight) do_preflight ;;
    build) do_build ;;
    test) do_test ;;
    bench) do_bench ;;
    parts) do_parts ;;
    all) do_preflight; do_test; do_bench ;;
    -h | --help) sed -n '2,41p' "$0"; exit 0 ;;
    *) echo "gpu_test: unknown step '$s' (preflight, build, test, bench, parts, all)" >&2; exit 2 ;;
  esac
done
