#!/usr/bin/env bash
# The cairn package as a user installs it with pip, from the checkout SRC:
#   bash tests/pip_install_test.sh SRC
#
# 1. `pip install .` into a fresh venv, its build requirements (scikit-build-core, pybind11)
#    fetched from PyPI into pip's isolated build environment, as on any machine with a
#    package index; then, from another directory, the package's files come from the venv
#    (not the checkout or a build tree), `cairn --help` and `python -m cairn --help` run
#    the installed program, a version is saved and restored
#    (tests/python/installed_smoke.py), and the README's quick-start (tests/python/
#    test_torch.py QuickStart: a run stopped after step 14 resumes from 13 or 14, no
#    version skipped) passes on the installed package.
# 2. `pip wheel .` (the build directory is kept, so little is compiled again), the wheel
#    installed into a second fresh venv with no package index, and the same checks but the
#    quick-start there, with /usr/local/cuda hidden (a mount namespace, when run as root):
#    a package built with CUDA imports and runs on the host copy engine where the CUDA
#    runtime is missing. The extension must not need libcudart.so at all.
# 3. `pip uninstall` removes the package and its command.
# The fresh venvs see the PyTorch and numpy of CAIRN_TEST_PYTHON's venv (the project's,
# scripts/venv.sh) through a .pth file, rather than installing 5 GB again. Exits 77
# (skipped) where no package index answers, unless CI=true (then it fails).
set -euo pipefail
src="$(cd "${1:?usage: pip_install_test.sh SRC}" && pwd)"
python="${CAIRN_TEST_PYTHON:-/usr/bin/python3}"
if ! "$python" -c "import venv, ensurepip" 2>/dev/null; then
  echo "skipped: needs venv and ensurepip for $python (Debian: python3-venv)"
  exit 77
fi
if ! "$python" -m pip download -q --no-deps -d "${TMPDIR:-/tmp}/cairn-pip-probe-$$" \
    scikit-build-core >/dev/null 2>&1; then
  rm -rf "${TMPDIR:-/tmp}/cairn-pip-probe-$$"
  if [ "${CI:-}" = true ]; then echo "FAILED: no package index answers pip" >&2; exit 1; fi
  echo "skipped: no package index answers pip (the build requirements come from PyPI)"
  exit 77
fi
rm -rf "${TMPDIR:-/tmp}/cairn-pip-probe-$$"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/cairn-test-pip-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }
quiet=(-q --disable-pip-version-check --no-input)

# The installed package, checked from a directory outside the checkout.
check() {
  local venv="$1" how="$2" full="${3:-0}"
  cd "$tmp"
  local file
  file=$("$venv/bin/python" -c "import cairn, cairn.torch, cairn._cairn as m; print(m.__file__)")
  case "$file" in
    "$venv"/*) echo "$how: cairn's extension comes from the venv: $file" ;;
    *) fail "$how: import cairn found $file, not the venv's package" ;;
  esac
  if ldd "$file" | grep -q "libcudart"; then
    fail "$how: the extension needs the CUDA runtime library: $(ldd "$file" | grep libcudart)"
  fi
  local out
  out=$("$venv/bin/cairn" --help) || fail "$how: 'cairn --help' failed"
  [[ "$out" == *"Usage"* ]] || fail "$how: 'cairn --help' printed no usage: $out"
  out=$("$venv/bin/python" -m cairn --help) || fail "$how: 'python -m cairn --help' failed"
  [[ "$out" == *"Usage"* ]] || fail "$how: 'python -m cairn --help' printed no usage"
  # A version saved and restored, and the CUDA engine opened or refused cleanly.
  mkdir -p "$tmp/smoke"
  out=$("$venv/bin/python" "$src/tests/python/installed_smoke.py" "$tmp/smoke" 2>&1) ||
    fail "$how: the installed package did not save and restore: $out"
  echo "$how: ${out##*$'\n'}"
  [ "$full" = 1 ] || return 0
  # The quick-start: the test's module from the checkout, cairn from the venv (PYTHONPATH
  # names only tests/python, which has no cairn package).
  if ! PYTHONPATH="$src/tests/python" "$venv/bin/python" -m unittest -v test_torch.QuickStart \
      >"$tmp/quickstart.log" 2>&1; then
    cat "$tmp/quickstart.log"
    fail "$how: the quick-start failed on the installed package"
  fi
  tail -3 "$tmp/quickstart.log"
}

# A fresh venv that sees the test interpreter's site-packages (its torch and numpy).
site=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
fresh() {
  "$python" -m venv "$1"
  local own
  own=$("$1/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  [ "$own" = "$site" ] || echo "$site" >"$own/cairn-test-torch.pth"
}

start=$SECONDS
fresh "$tmp/v1"
"$tmp/v1/bin/pip" install "${quiet[@]}" "$src"
echo "pip install (build requirements from PyPI): $((SECONDS - start)) s"
check "$tmp/v1" "pip install" 1

start=$SECONDS
"$tmp/v1/bin/pip" wheel "${quiet[@]}" --no-deps -w "$tmp/wheels" "$src"
wheel=$(ls "$tmp"/wheels/cairn-*.whl)
echo "pip wheel: $(basename "$wheel") in $((SECONDS - start)) s"
fresh "$tmp/v2"
"$tmp/v2/bin/pip" install "${quiet[@]}" --no-index "$wheel"
if [ -d /usr/local/cuda ] && [ "$(id -u)" = 0 ] && unshare -m --propagation unchanged true 2>/dev/null; then
  # Everything below in a mount namespace where /usr/local/cuda is an empty directory.
  export -f check fail
  export tmp src
  # Every mount of the new namespace is made private first, so the empty directory never
  # reaches the parent's; in a chroot (whose / is no mount point) /usr/local/cuda itself.
  unshare -m --propagation unchanged bash -c '{ mount --make-rprivate / 2>/dev/null ||
      mount --make-private /usr/local/cuda; } &&
    mount -t tmpfs -o ro none /usr/local/cuda &&
    [ -z "$(ls /usr/local/cuda)" ] && echo "the wheel, with /usr/local/cuda hidden:" &&
    check "$tmp/v2" "wheel without /usr/local/cuda"' || fail "the wheel without /usr/local/cuda"
else
  check "$tmp/v2" "wheel"
fi

"$tmp/v1/bin/pip" uninstall "${quiet[@]}" -y cairn
[ ! -e "$tmp/v1/bin/cairn" ] || fail "pip uninstall left $tmp/v1/bin/cairn"
if "$tmp/v1/bin/python" -c "import cairn" 2>/dev/null; then
  fail "pip uninstall left the cairn package importable"
fi
echo "pip uninstall removed the package and its command"
echo "pip install, wheel and uninstall: ok"
