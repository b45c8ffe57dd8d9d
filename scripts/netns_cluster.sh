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
#   netns_cluster.sh pfs NAME SERVERS DIR   add SERVERS storage servers (namespaces of their
#                                           own on the switch, 10.77.0.(101+s)) serving a
#                                           GlusterFS distributed volume "pfs", one brick
#                                           each; DIR holds their state, bricks and logs and
#                                           is removed by `down`
#   netns_cluster.sh mount NAME NODE MNT    mount the volume on MNT (in this machine's mount
#                                           namespace, so ranks run inside a node see it),
#                                           its FUSE client inside node NODE's network
#   netns_cluster.sh storage NAME S stop|cont|kill|start
#                                           freeze (SIGSTOP), resume, kill every process of,
#                                           or restart storage server S
#   netns_cluster.sh down NAME              kill every process in the cluster's namespaces
#                                           and delete them, resuming frozen servers and
#                                           detaching mounts first (safe to repeat)
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
storage_ns() { echo "$1-s$2"; }
PFS_BASE=101 # storage server s is at $SUBNET.$((PFS_BASE + s))

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
  local ns m
  # A frozen storage server is resumed first, and the volume's mounts detached (lazily: a
  # FUSE mount whose server is gone would hang a plain umount), before anything is killed.
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    [[ $ns =~ ^$name-s[0-9]+$ ]] || continue
    local frozen
    frozen=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n $frozen ]] && kill -CONT $frozen 2>/dev/null || true
  done
  if [[ -f $STATE/$name.mounts ]]; then
    while read -r m; do
      [[ -n $m ]] && umount -l "$m" 2>/dev/null || true
    done <"$STATE/$name.mounts"
  fi
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    [[ $ns == "$name-n"* || $ns == "$name-sw" || $ns =~ ^$name-s[0-9]+$ ]] || continue
    # Kill whatever still runs inside (a rank the test did not reap), then delete.
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n $pids ]] && kill -9 $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  if [[ -f $STATE/$name.pfs ]]; then
    local dir
    dir=$(cat "$STATE/$name.pfs")
    # (CAIRN_NETNS_KEEP_PFS=1 keeps it, to read a failed test's server and client logs.)
    [[ -n $dir && $dir != / && -z ${CAIRN_NETNS_KEEP_PFS:-} ]] && rm -rf "$dir"
  fi
  rm -f "$STATE/$name.owner" "$STATE/$name.pfs" "$STATE/$name.mounts"
}

# Starts glusterd for storage server $2 of cluster $1, its state under $3: in a mount
# namespace of its own, since glusterd keeps its state in /var/lib/glusterd and its sockets
# in /run, so that clusters of concurrent tests never share them.
start_glusterd() {
  local name=$1 s=$2 dir=$3
  ip netns exec "$(storage_ns "$name" "$s")" unshare -m --propagation private bash -c '
    set -e
    mount --bind "$1/lib" /var/lib/glusterd
    mount --bind "$1/log" /var/log/glusterfs
    mount -t tmpfs tmpfs /run
    mkdir -p /run/gluster
    rm -f "$1/pid"
    glusterd -p /run/glusterd.pid --log-file=/var/log/glusterfs/glusterd.log
    for _ in $(seq 100); do [[ -s /run/glusterd.pid ]] && break; sleep 0.05; done
    cp /run/glusterd.pid "$1/pid"' _ "$dir/s$s"
}

# The gluster CLI against server 0's glusterd: only its own socket takes commands (a remote
# CLI is read-only), so it runs in that daemon's mount and network namespaces.
gluster_cli() {
  local dir=$1
  shift
  nsenter -t "$(cat "$dir/s0/pid")" -m -n gluster --mode=script "$@"
}

# Runs "$@" until it succeeds, at most 50 times 0.2 s apart (daemons still starting).
retry() {
  local i
  for ((i = 0; i < 50; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  "$@"
}

cmd_pfs() {
  local name=$1 servers=$2 dir=$3
  check_name "$name"
  [[ $servers =~ ^[0-9]+$ && $servers -ge 1 && $servers -le 8 ]] || die "bad server count '$servers'"
  command -v glusterd >/dev/null && command -v glusterfs >/dev/null ||
    die "no GlusterFS here (Debian packages glusterfs-server and glusterfs-client)"
  [[ -f $STATE/$name.owner ]] || die "cluster $name is not up"
  [[ -f $STATE/$name.pfs ]] && die "cluster $name has its PFS already"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  echo "$dir" >"$STATE/$name.pfs"
  trap 'cmd_down "$name"' ERR
  local sw i ns addr bricks=()
  sw=$(switch_ns "$name")
  for ((i = 0; i < servers; i++)); do
    ns=$(storage_ns "$name" "$i")
    addr=$SUBNET.$((PFS_BASE + i))
    attach "$sw" "$ns" "s$i" "$addr"
    mkdir -p "$dir/s$i/lib" "$dir/s$i/log" "$dir/s$i/brick"
    start_glusterd "$name" "$i" "$dir"
    bricks+=("$addr:$dir/s$i/brick")
  done
  for ((i = 1; i < servers; i++)); do
    retry gluster_cli "$dir" peer probe "$SUBNET.$((PFS_BASE + i))"
  done
  # (force: the bricks are directories on this machine's root filesystem.)
  retry gluster_cli "$dir" volume create pfs transport tcp "${bricks[@]}" force
  # A client gives a server that stopped answering up after 5 s (the default is 42).
  gluster_cli "$dir" volume set pfs network.ping-timeout 5
  retry gluster_cli "$dir" volume start pfs
  trap - ERR
}

cmd_mount() {
  local name=$1 node=$2 mnt=$3
  check_name "$name"
  [[ -f $STATE/$name.pfs ]] || die "cluster $name has no PFS (netns_cluster.sh pfs)"
  local dir i
  dir=$(cat "$STATE/$name.pfs")
  mkdir -p "$mnt"
  mnt=$(cd "$mnt" && pwd)
  echo "$mnt" >>"$STATE/$name.mounts"
  # nsenter --net, not `ip netns exec` (which makes a mount namespace of its own): the mount
  # lands in this machine's mount namespace.
  # CAIRN_GLUSTER_CLIENT_ARGS: more options for the client (a test shows with
  # "--negative-timeout=30" what a client that caches lookups would hide).
  # shellcheck disable=SC2086
  nsenter --net="/run/netns/$(node_ns "$name" "$node")" glusterfs ${CAIRN_GLUSTER_CLIENT_ARGS:-} \
    --volfile-server="$SUBNET.$PFS_BASE" --volfile-id=pfs --log-file="$dir/client-$node.log" "$mnt"
  for ((i = 0; i < 100; i++)); do
    mountpoint -q "$mnt" && return 0
    sleep 0.05
  done
  die "the volume did not mount on $mnt (log: $dir/client-$node.log)"
}

cmd_storage() {
  local name=$1 s=$2 what=$3
  check_name "$name"
  [[ -f $STATE/$name.pfs ]] || die "cluster $name has no PFS"
  local pids
  pids=$(ip netns pids "$(storage_ns "$name" "$s")" 2>/dev/null || true)
  case $what in
    stop) [[ -z $pids ]] || kill -STOP $pids ;;
    cont) [[ -z $pids ]] || kill -CONT $pids ;;
    kill) [[ -z $pids ]] || kill -9 $pids ;;
    start)
      [[ -z $pids ]] || die "storage server $s of $name still runs"
      start_glusterd "$name" "$s" "$(cat "$STATE/$name.pfs")"
      ;;
    *) die "storage NAME S stop|cont|kill|start, not '$what'" ;;
  esac
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

# Makes namespace $2 and links it to switch namespace $1's bridge through port $3, its own
# end eth0 at address $4.
attach() {
  local sw=$1 ns=$2 port=$3 addr=$4
  ip netns add "$ns"
  ip -n "$sw" link add "$port" type veth peer name eth0 netns "$ns"
  ip -n "$sw" link set "$port" master br0 up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
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
    attach "$sw" "$ns" "n$i" "$SUBNET.$((i + 1))"
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

[[ $# -ge 1 ]] || die "usage: netns_cluster.sh check|up|exec|ns|addr|cut|heal|rate|pfs|mount|storage|down|sweep ..."
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
  pfs)
    [[ $# -eq 3 ]] || die "usage: pfs NAME SERVERS DIR"
    cmd_pfs "$@"
    ;;
  mount)
    [[ $# -eq 3 ]] || die "usage: mount NAME NODE MNT"
    cmd_mount "$@"
    ;;
  storage)
    [[ $# -eq 3 ]] || die "usage: storage NAME S stop|cont|kill|start"
    cmd_storage "$@"
    ;;
  *) die "unknown command '$verb'" ;;
esac
