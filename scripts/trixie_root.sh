# Helpers for a Debian 13 (trixie) root on this Debian 12 machine, sourced by
# scripts/gpu_sim.sh and scripts/debian13.sh (needs root: debootstrap, chroot, mounts).
#
#   trixie_root_lock ROOT                      holds ROOT.lock for the rest of the script:
#                                              waits for another run using ROOT, then
#                                              clears the mounts a killed run left
#   trixie_root_make ROOT NAME [PACKAGE ...]   debootstrap ROOT (minbase) and install the
#                                              packages, once: NAME marks it ready
#   trixie_root_mount ROOT [cuda]              mounts /proc, /sys, /dev, /dev/shm (and
#                                              /usr/local/cuda read-only) into ROOT, and
#                                              unmounts them when the script exits

trixie_root_lock() {
  local root="$1" fd
  mkdir -p "$(dirname "$root")"
  exec {fd}>"$root.lock"
  if ! flock -n "$fd"; then
    echo "waiting for the other run using $root to finish"
    flock -w 3600 "$fd" || { echo "$root: still in use after an hour" >&2; exit 2; }
  fi
  # We hold the lock, so whatever is mounted under ROOT belongs to a run that died without
  # its EXIT trap (SIGKILL, a lost terminal): take it down, deepest first.
  if grep -q " $root/" /proc/mounts; then
    echo "$root: unmounting what a killed run left mounted"
    _trixie_unmount_under "$root"
  fi
}

# Lazily unmounts everything mounted under ROOT, deepest first.
_trixie_unmount_under() {
  local m
  for m in $(awk -v r="$1/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
}

trixie_root_make() {
  local root="$1" name="$2"
  shift 2
  [ -e "$root/.cairn-$name-ready" ] && return 0
  echo "$name: making a Debian 13 root in $root"
  command -v debootstrap >/dev/null || {
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap >/dev/null
  }
  if grep -q " $root/" /proc/mounts; then
    echo "$name: something is still mounted under $root (another run?); unmount it first" >&2
    exit 2
  fi
  rm -rf "$root"
  local mirror
  mirror=$(grep -h "^URIs:" /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' |
           grep -v security | head -1)
  debootstrap --variant=minbase trixie "$root" "${mirror:-http://deb.debian.org/debian}" >/dev/null
  if (($#)); then
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq --no-install-recommends \
      "$@" >/dev/null
  fi
  touch "$root/.cairn-$name-ready"
}

trixie_mounted=()
trixie_root=""
trixie_root_unmount() {
  local i
  for ((i = ${#trixie_mounted[@]} - 1; i >= 0; i--)); do
    umount -l "${trixie_mounted[$i]}" 2>/dev/null || true
  done
  trixie_mounted=()
  # And what the run mounted inside the root itself: iproute2 makes /run/netns a bind
  # mount of itself at its first `ip netns` there (the namespace tests, which skip).
  if [ -n "$trixie_root" ]; then _trixie_unmount_under "$trixie_root"; fi
}

trixie_root_mount() {
  local root="$1" cuda="${2:-}"
  if grep -q " $root/" /proc/mounts; then
    echo "something is still mounted under $root (another run?); unmount it first" >&2
    exit 2
  fi
  trixie_root="$root"
  trap trixie_root_unmount EXIT
  _trixie_mount_at "$root/proc" -t proc proc
  _trixie_mount_at "$root/sys" -t sysfs sys  # UCX's tcp transport reads the interfaces there
  _trixie_mount_at "$root/dev" --bind /dev
  _trixie_mount_at "$root/dev/shm" --bind /dev/shm
  if [ -n "$cuda" ] && [ -d /usr/local/cuda/include ]; then
    _trixie_mount_at "$root/usr/local/cuda" --bind -o ro /usr/local/cuda
  fi
}

_trixie_mount_at() {  # TARGET MOUNT-ARGS...
  local target="$1"
  shift
  mkdir -p "$target"
  mount "$@" "$target"
  trixie_mounted+=("$target")
}
