#!/usr/bin/env bash
# Install the studio with its test extras into ./.venv and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
# QtMultimedia needs the PulseAudio client library; install it where it is missing and we can.
if ! ldconfig -p 2>/dev/null | grep -q "libpulse.so.0"; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq libpulse0) >/dev/null 2>&1 || true
  fi
fi
# The WebRTC test drives a real headless Chromium (Debian's package); install it where we can.
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
      >/dev/null 2>&1 || true
  fi
fi
.venv/bin/ruff check studio tests
# the house plan: layers that only look down, Qt only under gui/ (pyproject [tool.importlinter])
.venv/bin/lint-imports
# two workers (this machine's two cores), each module's tests on one worker (its fixtures made
# once); then the real-time measurements (marked serial) alone. Exit 5: a selection with none.
.venv/bin/python -m pytest -q -n 2 --dist loadscope -m "not serial" "$@" || [ $? -eq 5 ]
.venv/bin/python -m pytest -q -m serial "$@" || [ $? -eq 5 ]
# the built wheel, installed (not editable) in a fresh venv, renders the demo
bash scripts/wheel_check.sh
