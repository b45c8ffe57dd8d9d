#!/usr/bin/env bash
# A small cluster on this machine: N "nodes", each a network namespace of its own with one
# link (a veth pair) to a switch (a Linux bridge in a namespace of its own), so nothing
# touches this machine's own network. Node i has the address 10.77.0.(i+1)/24 on its eth0;
# every cluster uses that same private /24, each inside its own namespaces.
#
#   netns_cluster.sh check                  exit 0 when namespaces can be made here, else
#                                           print why (tests skip with that reason)
#   netns_cluster.sh up NAME NODES [RATE]   make cluster NAME (a tbf rate limit per node
#                                           link, both ways, when RATE is given: 1gbit, 200mbit)
#   netns_cluster.sh exec NAME NODE CMD...  run CMD inside node NODE
#   netns_cluster.sh ns NAME NODE           print node NODE's namespace name
#   netns_cluster.sh addr NAME NODE         print node NODE's address
#   netns_cluster.sh cut NAME NODE          take node NODE's switch port down: a partition
#                                           (no reset reaches anyone; TCP just stops)
#   netns_cluster.sh heal NAME NODE         bring it back up
#   netns_cluster.sh rate NAME NODE [RATE]  set (or, without RATE, remove) node NODE's
#                                           link's rate limit, both ways
#   netns_cluster.sh down NAME              kill every process in the cluster's namespaces
#                                           and delete them (safe to repeat)
#   netns_cluster.sh sweep                  take down every cluster whose owner has exited
#
# NAME: letters, digits and '-', at most 24 characters, unique per cluster (tests use their
# job id). `up` records its owner (CAIRN_NETNS_OWNER, else the calling process) so that a
# cluster left by a test killed before its cleanup ran is removed by the next `up` or `sweep`.
# Needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2.
set -euo pipefail

STATE=${CAIRN_NETNS_STATE:-/run/cairn-netns}
SUBNET=10.77.0

die() {
  echo "netns_cluster: $*" >&2
  exit 1
}

check_name() {
  [[ $1 =~ ^[A-Za-z0-9-]{1,24}$ ]] || die "bad cluster name '$1' (letters, digits, '-', <= 24)"
}

node_ns() { echo "$1-n$2"; }
switch_ns() { echo "$1-sw"; }

cmd_check() {
  command -v ip >/dev/null || {
    echo "no 'ip' command (Debian package iproute2)"
    return 1
  }
  local probe="cairn-probe-$$"
  if ! err=$(ip netns add "$probe" 2>&1); then
    echo "cannot make a network namespace here (need root or CAP_SYS_ADMIN): $err"
    return 1
  fi
  if ! err=$(ip -n "$probe" link add b0 type bridge 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    echo "cannot make a bridge inside a network namespace: $err"
    return 1
  fi
  if ! err=$(ip netns exec "$probe" true 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    echo "cannot run a program inside a network namespace: $err"
    return 1
  fi
  ip netns del "$probe"
}

cmd_down() {
  local name=$1
  check_name "$name"
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    [[ $ns == "$name-n"* || $ns == "$name-sw" ]] || continue
    # Kill whatever still runs inside (a rank the test did not reap), then delete.
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n $pids ]] && kill -9 $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -f "$STATE/$name.owner"
}

cmd_sweep() {
  [[ -d $STATE ]] || return 0
  local f name owner
  for f in "$STATE"/*.owner; do
    [[ -e $f ]] || continue
    name=$(basename "$f" .owner)
    owner=$(cat "$f" 2>/dev/null || echo 0)
    if [[ ! $owner =~ ^[0-9]+$ ]] || ! kill -0 "$owner" 2>/dev/null; then
      echo "netns_cluster: removing cluster $name left by exited process $owner" >&2
      cmd_down "$name"
    fi
  done
}

cmd_up() {
  local name=$1 nodes=$2 rate=${3:-}
  check_name "$name"
  [[ $nodes =~ ^[0-9]+$ && $nodes -ge 1 && $nodes -le 200 ]] || die "bad node count '$nodes'"
  cmd_sweep
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$(switch_ns "$name")" &&
    die "cluster $name exists already"
  mkdir -p "$STATE"
  echo "${CAIRN_NETNS_OWNER:-$PPID}" >"$STATE/$name.owner"
  # Anything failing below takes down what was made.
  trap 'cmd_down "$name"' ERR
  local sw
  sw=$(switch_ns "$name")
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  local i ns
  for ((i = 0; i < nodes; i++)); do
    ns=$(node_ns "$name" "$i")
    ip netns add "$ns"
    ip -n "$sw" link add "n$i" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "n$i" master br0 up
    ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    [[ -z $rate ]] || cmd_rate "$name" "$i" "$rate"
  done
  trap - ERR
}

cmd_rate() {
  local name=$1 node=$2 rate=${3:-}
  check_name "$name"
  local ns sw
  ns=$(node_ns "$name" "$node")
  sw=$(switch_ns "$name")
  tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
  tc -n "$sw" qdisc del dev "n$node" root 2>/dev/null || true
  [[ -n $rate ]] || return 0
  tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 512kb latency 100ms
  tc -n "$sw" qdisc add dev "n$node" root tbf rate "$rate" burst 512kb latency 100ms
}

cmd_port() {
  local name=$1 node=$2 state=$3
  check_name "$name"
  ip -n "$(switch_ns "$name")" link set "n$node" "$state"
}

[[ $# -ge 1 ]] || die "usage: netns_cluster.sh check|up|exec|ns|addr|cut|heal|rate|down|sweep ..."
verb=$1
shift
case $verb in
  check) cmd_check ;;
  up)
    [[ $# -ge 2 ]] || die "usage: up NAME NODES [RATE]"
    cmd_up "$@"
    ;;
  down)
    [[ $# -eq 1 ]] || die "usage: down NAME"
    cmd_down "$1"
    ;;
  sweep) cmd_sweep ;;
  exec)
    [[ $# -ge 3 ]] || die "usage: exec NAME NODE CMD..."
    name=$1 node=$2
    shift 2
    exec ip netns exec "$(node_ns "$name" "$node")" "$@"
    ;;
  ns) node_ns "$1" "$2" ;;
  addr) echo "$SUBNET.$(($2 + 1))" ;;
  cut) cmd_port "$1" "$2" down ;;
  heal) cmd_port "$1" "$2" up ;;
  rate) cmd_rate "$@" ;;
  *) die "unknown command '$verb'" ;;
esac
