#!/usr/bin/env bash
# Builds cairn and runs its C++ test suite on Debian 13 (trixie: GCC 14, UCX 1.18,
# Python 3.13) from this Debian 12 machine, in a Debian 13 root made with debootstrap. The
# Python tests are left to the Debian 12 suite, on PyPI's PyTorch (scripts/venv.sh): here
# the module is built for Debian 13's python3, without PyTorch (CAIRN_NO_TORCH=1). The root
# (and its installed packages) is cached in CAIRN_DEBIAN13_ROOT between runs on one machine;
# the tracked files are copied in fresh each run, into /cairn, built in /cairn/build
# (RelWithDebInfo, or CAIRN_BUILD_TYPE; warnings are errors) by the same scripts/test.sh as
# on Debian 12, which installs what the root lacks from Debian 13.
#
#   bash scripts/debian13.sh                  # everything
#   bash scripts/debian13.sh -R '^Persist'    # arguments go to ctest
#
# Needs root (debootstrap, chroot, mounts) and the Debian registry. Leaves no mount
# behind, also when a test fails or the script is interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
root="${CAIRN_DEBIAN13_ROOT:-/var/tmp/cairn-debian13-root}"
if [ "$(id -u)" -ne 0 ]; then echo "debian13: needs root (debootstrap, chroot, mounts)" >&2; exit 2; fi
. scripts/trixie_root.sh
trixie_root_lock "$root"
trixie_root_make "$root" debian13  # scripts/test.sh inside installs the packages
trixie_root_mount "$root" cuda     # the CUDA path is built on Debian 13 too
# The tracked files. The build directory is kept between runs (incremental), so a file is
# copied only when its content changed (then with the current time, which ninja sees as
# newer than its outputs), and files no longer tracked are removed.
mkdir -p "$root/cairn" "$root/cairn.new"
rm -rf "$root/cairn.new"/*
git ls-files -z | tar --null -cf - -T - | tar -xf - -C "$root/cairn.new"
(cd "$root/cairn.new" && find . -type f -print0) | while IFS= read -r -d '' f; do
  if ! cmp -s "$root/cairn.new/$f" "$root/cairn/$f"; then
    mkdir -p "$(dirname "$root/cairn/$f")"
    cp "$root/cairn.new/$f" "$root/cairn/$f"
  fi
done
(cd "$root/cairn" && find . -path ./build -prune -o -type f -print0) | while IFS= read -r -d '' f; do
  [ -e "$root/cairn.new/$f" ] || rm -f "$root/cairn/$f"
done
rm -rf "$root/cairn.new"
echo "debian13: building and testing in $root/cairn ($(chroot "$root" sh -c '. /etc/os-release; echo "$PRETTY_NAME"'))"
# USE_LIBUV=0: Debian 13's torch is built without libuv, which gloo's TCPStore asks for.
# CI and its stage name pass in: under CI a failed test runs once more (scripts/ctest_ci.sh),
# and the names of those that passed then are handed back to the checkout's .ci-flaky.log.
rm -f "$root/cairn/.ci-flaky.log"
chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/var/tmp \
  CI="${CI:-}" CAIRN_CI_STAGE=debian13 CAIRN_BUILD_TYPE="${CAIRN_BUILD_TYPE:-RelWithDebInfo}" \
  CAIRN_NO_TORCH=1 USE_LIBUV=0 bash -c 'cd /cairn && bash scripts/test.sh "$@"' test.sh "$@"
if [ -s "$root/cairn/.ci-flaky.log" ]; then
  cat "$root/cairn/.ci-flaky.log" >>"${CAIRN_FLAKY_LOG:-$PWD/.ci-flaky.log}"
  rm -f "$root/cairn/.ci-flaky.log"
fi
