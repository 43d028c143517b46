#!/usr/bin/env bash
# Run a command on a lent GPU machine that has no network: install the wheelhouse (.whl/, built by
# the GPU machine's instructions) once into a folder of this account's, name the commit for rows (no .git
# there), then run "$@".
#   bash ci/gpu-run.sh python3 -m snakemake --cores 1 --config run=h100
# Not /tmp: another account could make /tmp/site or /tmp/pycache first and have us import its code.
set -euo pipefail
cache=${XDG_CACHE_HOME:-$HOME/.cache}/cs336sys-gpu
mkdir -p -m 700 "$cache"
[ -O "$cache" ] && [ ! -L "$cache" ] || { echo "gpu-run: $cache is not this account's own folder" >&2; exit 1; }
site=$cache/site
stamp=$site/.installed-$(ls .whl | md5sum | cut -c1-12)  # once per machine and wheel set
if [ ! -f "$stamp" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
  touch "$stamp"
fi
export PYTHONPATH=$site:$PWD/src PYTHONUNBUFFERED=1
# The lent machines' image sets PYTHONDONTWRITEBYTECODE=1 and ships torch without .pyc files, so
# every Python process there compiled torch, pandas and snakemake from source (seconds each).
# A pip install writes them; a bytecode cache of this account's does the same for this machine.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-$cache/pycache}
export CS336SYS_GIT_COMMIT=${CS336SYS_GIT_COMMIT:-$(cat .commit 2>/dev/null || echo unknown)}
exec "$@"
