#!/usr/bin/env bash
# Install the studio with its test extras into ./.venv and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
.venv/bin/ruff check studio tests
.venv/bin/python -m pytest -q "$@"
