#!/usr/bin/env bash
# Install the studio into ./.venv and render the built-in demo to demo.mp4.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/studio render --demo --out demo.mp4 --report demo.json
