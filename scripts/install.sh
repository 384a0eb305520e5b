#!/usr/bin/env bash
# Install the studio into ./.venv: torch first (the CPU build where no GPU wheel is wanted),
# then the project. Usage: scripts/install.sh [EXTRAS], e.g. scripts/install.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch==2.13.0: on the project's build machines this resolves to a local CPU wheel;
# elsewhere it is PyPI's default build for the platform.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install --quiet -e ".[$extras]"
else
  .venv/bin/python -m pip install --quiet -e .
fi
