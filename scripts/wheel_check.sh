#!/usr/bin/env bash
# Build the wheel, install it (not editable) into a fresh venv, and render the demo from
# another folder: what a user who runs `pip install talkinghead-studio` gets. Called by
# scripts/test.sh after the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/python -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" .
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --upgrade pip
"$work/venv/bin/python" -m pip install --quiet "torch==2.13.0"
"$work/venv/bin/python" -m pip install --quiet "$work"/dist/*.whl
mkdir "$work/elsewhere"
cd "$work/elsewhere"
"$work/venv/bin/studio" render --demo --out demo.mp4 --report demo.json >/dev/null
test -s demo.mp4 && test -s demo.json
echo "wheel check: $(ls "$work"/dist) installed in a fresh venv renders the demo"
