#!/usr/bin/env bash
# Measures core/pool.h on cairn's own threads (build/, the default) against the same pool
# on oneTBB (build-pool-tbb/, cmake -DCAIRN_POOL=tbb), the capture, persist and restore
# benchmarks alternated arm by arm (threads, tbb, threads, tbb, ...), so that both see the
# same machine. Prints every run's JSON line, then one JSON line: per benchmark and arm the
# median of its headline figures, and tbb over threads.
#
#   bash scripts/pool_ab.sh [ROUNDS]     # default 3
#   CAIRN_AB_BEFORE=DIR                  # a third arm: the benchmarks built in DIR/bench
#                                        # (for example from the commit before the pool)
#   CAIRN_AB_DIR=/var/tmp                # where persist and restore write (a real disk)
#
# Sizes are small enough for 2 cores and 24 GiB: capture 256 MiB with 4 copy threads
# (the pool is used only with more than one), persist 512 MiB on 2 ranks with 4 writers,
# restore 512 MiB per rank (4 readers). docs/performance.md has the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
dir="${CAIRN_AB_DIR:-/var/tmp}"
targets=(bench_capture bench_persist bench_restore)
bash scripts/setup.sh >/dev/null
if ! dpkg-query -W -f='${Status}' libtbb-dev 2>/dev/null | grep -q "install ok installed"; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    libtbb-dev >/dev/null
fi
ninja -C build "${targets[@]}" >/dev/null
if [ ! -f build-pool-tbb/build.ninja ]; then
  cmake -S . -B build-pool-tbb -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_POOL=tbb \
    -DCAIRN_BUILD_TESTS=OFF -DCAIRN_WITH_PYTHON=OFF >/dev/null
fi
ninja -C build-pool-tbb "${targets[@]}" >/dev/null
arms=(threads:build tbb:build-pool-tbb)
if [ -n "${CAIRN_AB_BEFORE:-}" ]; then arms+=("before:$CAIRN_AB_BEFORE"); fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() {  # arm bench args...
  local arm=$1 bench=$2
  shift 2
  local line
  line=$("$bench" "$@" 2>/dev/null | tail -1)
  echo "$line"
  echo "$line" >>"$out/${arm%%:*}.$(basename "$bench")"
}
for ((r = 1; r <= rounds; r++)); do
  for arm in "${arms[@]}"; do
    b="${arm#*:}/bench"
    echo "== round $r, ${arm%%:*}"
    run "$arm" "$b/capture" --sizes 256M --rounds 2 --iters 4 --threads 4
    run "$arm" "$b/persist" --bytes 512M --ranks 2 --rounds 2 --dir "$dir" --stall-iters 16
    run "$arm" "$b/restore" --bytes 512M --rounds 2 --dir "$dir"
  done
done
python3 - "$out" "${arms[@]}" <<'PY'
import json, os, statistics, sys
out, arms = sys.argv[1], [a.split(":")[0] for a in sys.argv[2:]]
heads = {"capture": ["copy_gbps", "copy_vs_memcpy", "stall_ms_lazy"],
         "persist": ["persist_gbps", "persist_vs_raw", "stall_ms_during_drain"],
         "restore": ["local_vs_memcpy", "peer_vs_raw", "pfs_vs_raw_read", "reshard_over_same_layout"]}
res = {}
for b, keys in heads.items():
    for a in arms:
        rows = [json.loads(l) for l in open(os.path.join(out, f"{a}.{b}")) if l.startswith("{")]
        res.setdefault(b, {})[a] = {k: round(statistics.median(r[k] for r in rows), 4) for k in keys}
    if "tbb" in res[b] and "threads" in res[b]:
        res[b]["tbb_over_threads"] = {k: round(res[b]["tbb"][k] / res[b]["threads"][k], 3)
                                      for k in keys if res[b]["threads"][k]}
print(json.dumps({"bench": "pool_ab", "rounds": len(rows), **res}))
PY
