#!/usr/bin/env bash
# bench/memory on an overloaded machine: before each run, N busy loops take the cores for
# the run's length, so the pushes of replicas or parity fall behind the saves. Prints each
# run's JSON line for the scheme (issue 34 part 3 in docs/performance.md: with parity the
# agreed step then lags by tens of steps; with replicas and no PFS step a lost node may
# find nothing restorable).
#
#   bash scripts/memory_overload.sh [SCHEME] [SLOTS] [FIRST_SEED] [RUNS] [BUSY]
#   (defaults: xor 3 31 8 2; build/bench/memory must be built; CAIRN_MEMORY_BENCH names
#   another build of it, e.g. the code before a change, for an A/B)
set -uo pipefail
cd "$(dirname "$0")/.."
scheme="${1:-xor}" slots="${2:-3}" first="${3:-31}" runs="${4:-8}" busy="${5:-2}"
bench="${CAIRN_MEMORY_BENCH:-build/bench/memory}"
[ -x "$bench" ] || { echo "memory_overload: build $bench first (cmake --build build --target bench_memory)" >&2; exit 2; }
for ((seed = first; seed < first + runs; seed++)); do
  for ((j = 0; j < busy; j++)); do timeout 20 sh -c 'while :; do :; done' & done
  # One kill per run (benches before --kills made one anyway).
  kills=""
  "$bench" --help 2>/dev/null | grep -q -- --kills && kills="--kills 1"
  line=$("$bench" --schemes "$scheme" --bytes 4M --steps 200 --iteration-ms 50 --slots "$slots" \
    --persist-every 0 --rounds 1 --seed "$seed" $kills 2>/tmp/memory_overload.$$.err | tail -1)
  wait
  if [ -z "$line" ]; then
    echo "seed $seed: the run failed: $(grep -m1 -o 'NotFound.*' /tmp/memory_overload.$$.err || tail -n 1 /tmp/memory_overload.$$.err)"
  else
    echo "seed $seed: $line"
  fi
done
rm -f /tmp/memory_overload.$$.err
