#!/usr/bin/env bash
# Run a command on a lent GPU machine that has no network: install the wheelhouse (.whl/, built by
# the GPU machine's instructions) into /tmp/site once, name the commit for rows (no .git there), then run "$@".
#   bash ci/gpu-run.sh python3 -m snakemake --cores 1 --config run=h100
set -euo pipefail
stamp=/tmp/site/.installed-$(ls .whl | md5sum | cut -c1-12)  # once per machine and wheel set
if [ ! -f "$stamp" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  touch "$stamp"
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
# The lent machines' image sets PYTHONDONTWRITEBYTECODE=1 and ships torch without .pyc files, so
# every Python process there compiled torch, pandas and snakemake from source (seconds each).
# A pip install writes them; a bytecode cache in /tmp does the same for this machine.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
export CS336SYS_GIT_COMMIT=${CS336SYS_GIT_COMMIT:-$(cat .commit 2>/dev/null || echo unknown)}
exec "$@"
