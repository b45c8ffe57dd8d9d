#!/usr/bin/env bash
# Issue 33's before/after: the capture, persist and restore benchmarks of the commit before
# issue 33 (68ee907) and of this tree (build/), alternated (now, before; then before, now),
# ROUNDS times; prints each arm's medians and runs, and now over before.
#
#   git worktree add /var/tmp/before33 68ee907
#   (cd /var/tmp/before33 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
#      -DCAIRN_BUILD_TESTS=OFF -DCAIRN_WITH_PYTHON=OFF && ninja -C build bench_capture \
#      bench_persist bench_restore)
#   bash scripts/issue33_ab.sh [ROUNDS]      # default 5; BEFORE=/var/tmp/before33/build/bench
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ninja -C build bench_capture bench_persist bench_restore >/dev/null
now=build/bench; before=${BEFORE:-/var/tmp/before33/build/bench}
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then arms="now before"; else arms="before now"; fi
  for arm in $arms; do
    if [ $arm = now ]; then b=$now; else b=$before; fi
    echo "== round $r $arm $(date +%T)"
    $b/capture --sizes 256M --rounds 2 --iters 4 --threads 4 2>/dev/null | tail -1 >> $out/$arm.capture
    $b/persist --bytes 512M --ranks 2 --rounds 2 --dir /var/tmp --stall-iters 16 2>/dev/null | tail -1 >> $out/$arm.persist
    $b/restore --bytes 512M --rounds 2 --dir /var/tmp 2>/dev/null | tail -1 >> $out/$arm.restore
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
heads = {"capture": ["copy_gbps", "copy_vs_memcpy"],
         "persist": ["persist_gbps", "persist_vs_raw"],
         "restore": ["local_vs_memcpy", "peer_vs_raw", "pfs_vs_raw_read", "reshard_over_same_layout"]}
res = {}
for b, keys in heads.items():
    for a in ["now", "before"]:
        rows = [json.loads(l) for l in open(f"{out}/{a}.{b}") if l.startswith("{")]
        res.setdefault(b, {})[a] = {k: [round(statistics.median(r[k] for r in rows), 3), [r[k] for r in rows]] for k in keys}
    res[b]["now_over_before"] = {k: round(res[b]["now"][k][0] / res[b]["before"][k][0], 3) for k in keys}
print(json.dumps({"bench": "ab33", **res}))
PY
