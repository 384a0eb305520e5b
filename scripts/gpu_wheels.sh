#!/usr/bin/env bash
# The wheels a GPU machine's image lacks for a render, a batch and the warm-start bench
# (Python 3.12, manylinux x86_64), at the versions this venv holds, into ./.whl (git ignores
# it: add `/.whl/` to .git/info/exclude once). With `ray`, Ray Data's too: a tar.xz (62 MB)
# in two halves, ./.ray1/part and ./.ray2/part, since a device call carries at most 64 MiB
# with the tree (scripts/device_call.sh joins and unpacks them onto PYTHONPATH). The GPU call
# installs the wheels with `pip install --no-index --no-deps --target DIR .whl/*.whl`.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
version() { "$py" -c "import importlib.metadata as m; print(m.version('$1'))"; }
get() {  # DIR NAME...: the wheels of NAME... at this venv's versions, into DIR
  local dir=$1 specs=()
  shift
  for n in "$@"; do specs+=("$n==$(version "$n")"); done
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform any -d "$dir" "${specs[@]}"
}
mkdir -p .whl
get .whl av soundfile cffi pycparser soxr pydantic pydantic_core annotated-types \
  typing-inspection platformdirs shtab silero-vad py-spy
ls .whl
if [ "${1:-}" = ray ]; then
  tmp=$(mktemp -d)
  get "$tmp/w" ray jsonschema jsonschema-specifications referencing rpds-py
  "$py" -m pip install -q --no-deps --no-compile --target "$tmp/site" --python-version 3.12 \
    --implementation cp --only-binary=:all: --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform any "$tmp"/w/*.whl
  tar -cJf "$tmp/raysite.tar.xz" -C "$tmp/site" .
  mkdir -p .ray1 .ray2
  split -n 2 -d "$tmp/raysite.tar.xz" "$tmp/part"
  mv "$tmp/part00" .ray1/part && mv "$tmp/part01" .ray2/part
  rm -rf "$tmp"
  ls -la .ray1 .ray2
fi
