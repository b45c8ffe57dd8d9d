#!/usr/bin/env bash
# Makes the project's Python environment and prints its interpreter's path, last:
#   bash scripts/venv.sh            CAIRN_VENV (default .venv), with python/requirements.txt
#   bash scripts/venv.sh --oldest   CAIRN_VENV_OLDEST (default .venv-oldest), with the
#                                   oldest PyTorch cairn supports (that file's "# oldest:")
# A venv over Debian's /usr/bin/python3 (cairn's extension module is built for it). The
# wheels are downloaded once into CAIRN_WHEELS (default /var/tmp/cairn-wheels) and
# installed from there, so a second checkout on the same machine downloads nothing; a
# venv whose stamp matches the pins is left as it is. CAIRN_TORCH_INDEX: an extra package
# index, e.g. https://download.pytorch.org/whl/cpu, whose CPU build of the pinned torch
# pip then prefers (PyPI has only the CUDA build for Linux x86_64).
set -euo pipefail
cd "$(dirname "$0")/.."
req_file=python/requirements.txt
if [ "${1:-}" = "--oldest" ]; then
  venv="${CAIRN_VENV_OLDEST:-.venv-oldest}"
  reqs=$(sed -n 's/^# oldest: *//p' "$req_file")
  shift
else
  venv="${CAIRN_VENV:-.venv}"
  reqs=$(grep -v '^\s*#' "$req_file" | grep -v '^\s*$' | tr '\n' ' ')
fi
# Requirements PyPI has as source only (deepspeed): their wheels are built once, without
# build isolation (their setup imports torch), against this venv's torch, and cached.
source_only=(deepspeed)
if (($#)); then echo "venv.sh: unknown argument '$1' (use --oldest or nothing)" >&2; exit 2; fi
[ -n "$reqs" ] || { echo "venv.sh: no requirements found in $req_file" >&2; exit 2; }
base=/usr/bin/python3
wheels="${CAIRN_WHEELS:-/var/tmp/cairn-wheels}"
mkdir -p "$wheels" "$(dirname "$venv")"
stamp="$($base --version) $reqs ${CAIRN_TORCH_INDEX:-}"
exec 9>"$venv.lock"
flock 9
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.cairn-stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$(cd "$venv" && pwd)/bin/python"
  exit 0
fi
rm -rf "$venv"
start=$SECONDS
$base -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
index=()
if [ -n "${CAIRN_TORCH_INDEX:-}" ]; then index=(--extra-index-url "$CAIRN_TORCH_INDEX"); fi
binary=() built=()
for r in $reqs; do
  name=${r%%[=<>]*}
  if [[ " ${source_only[*]} " == *" $name "* ]]; then built+=("$r"); else binary+=("$r"); fi
done
install() {
  "${pip[@]}" install --no-index --find-links "$wheels" "${binary[@]}" || return
  local r name version
  for r in "${built[@]}"; do
    name=${r%%==*} version=${r#*==}
    if ! compgen -G "$wheels/${name}-${version}-*.whl" >/dev/null; then
      compgen -G "$wheels/${name}-${version}.tar.gz" >/dev/null || return
      echo "venv: building the wheel of $r" >&2
      "${pip[@]}" wheel --no-build-isolation --no-deps --no-index -w "$wheels" \
        "$wheels/${name}-${version}.tar.gz" >&2 || return
    fi
  done
  if ((${#built[@]})); then "${pip[@]}" install --no-index --find-links "$wheels" "${built[@]}"; fi
}
if ! install 2>/dev/null; then
  echo "venv: downloading $reqs into $wheels" >&2
  dl=$SECONDS
  # shellcheck disable=SC2086  # $reqs is a list of requirement words
  "${pip[@]}" download "${index[@]}" -d "$wheels" $reqs
  echo "venv: downloaded in $((SECONDS - dl)) s ($(du -sh "$wheels" | cut -f1) in $wheels)" >&2
  install
fi
echo "$stamp" >"$venv/.cairn-stamp"
echo "venv: $venv ready in $((SECONDS - start)) s: $("$venv/bin/python" -c \
  'import torch; print("torch", torch.__version__)')" >&2
echo "$(cd "$venv" && pwd)/bin/python"
