#!/usr/bin/env bash
# One call of the device tool for issue 20's warm-start and batch figures (what a session
# needs on a bare GPU machine). Prepare here first, at no device cost:
#   printf '/.whl/\n/.ray1/\n/.ray2/\n/.base/\n' >> .git/info/exclude
#   bash scripts/gpu_wheels.sh ray          # .whl (50 MB), .ray1 and .ray2 (31 MB each)
#   mkdir -p .base && git archive BASE | gzip > .base/base.tgz   # for `base` (2 MB)
# A call carries at most 64 MiB with the tree, so carry .whl (and .base) in the first call,
# whose packages stay in /tmp/site on the warm machine; for Ray, .ray1 in a `stage` call and
# .ray2 in the Ray call after it (the halves are joined and unpacked into /tmp/raysite). The
# machine is given back 30 s after a call, so chain them. Usage, in the device call:
#   bash scripts/device_call.sh LABEL warm [studio bench --suite warmstart options]
#   bash scripts/device_call.sh LABEL base [options]   # the same from .base/base.tgz's tree
#     (BASE_TGZ=.base/other.tgz BASE_OUT=/tmp/b3 for a second older tree in the same call)
#   bash scripts/device_call.sh LABEL stage            # only keep what this call carries
#   bash scripts/device_call.sh LABEL tests [pytest options]  # LMDM's and the engine's CUDA
#     tests: by default those of the window graphs and the clip's motion (14 s on an H200;
#     both files whole took 193 s on an H100: pass `-k ""` for them all)
# LABEL names the commit of the tree that runs (the copy has no .git). `warm` runs
# scripts/bench_gpu.sh's warmstart step into /tmp/b (its cache kept for later calls); `base`
# runs the older tree's against the same cache into /tmp/b2 (an A/B on one machine). Every
# 10 s, and at the end, the reports and each process's log are copied to $OUT
# (b.json/b.md, b2.json/b2.md, b3.json/b3.md, logs.tgz).
set -uo pipefail
label=${1:?usage: scripts/device_call.sh LABEL warm|base|stage [options]}
step=${2:?usage: scripts/device_call.sh LABEL warm|base|stage [options]}
shift 2
site=/tmp/site
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target "$site" .whl/*.whl
export PATH=$site/bin:$PATH  # py-spy (the bench's --sample)
mkdir -p /tmp/raybundle
for half in 1 2; do
  [ -f .ray$half/part ] && cp .ray$half/part /tmp/raybundle/part$half
done
if [ -f /tmp/raybundle/part1 ] && [ -f /tmp/raybundle/part2 ] && [ ! -d /tmp/raysite ]; then
  mkdir -p /tmp/raysite
  cat /tmp/raybundle/part1 /tmp/raybundle/part2 | tar -xJf - -C /tmp/raysite
fi
[ "$step" = stage ] && { ls /tmp/site /tmp/raybundle 2>/dev/null | head -3; exit 0; }
export PYTHONUNBUFFERED=1
save() {  # the reports so far, and every process's log in one tar (at most 8 files return)
  local logs=()
  for d in b b2 b3; do
    [ -f /tmp/$d/warmstart.json ] && cp /tmp/$d/warmstart.json "$OUT/$d.json"
    [ -f /tmp/$d/warmstart.md ] && cp /tmp/$d/warmstart.md "$OUT/$d.md"
    [ -d /tmp/$d/logs ] && logs+=("$d/logs")
  done
  [ ${#logs[@]} -gt 0 ] && tar -czf "$OUT/logs.tgz.part" -C /tmp "${logs[@]}" 2>/dev/null &&
    mv "$OUT/logs.tgz.part" "$OUT/logs.tgz"
  return 0
}
if [ "$step" = tests ]; then  # the GPU tests of LMDM's captured windows and the Ditto engine
  mkdir -p /tmp/b/logs "$OUT"
  [ -e studio/resources ] || ln -sfn ../resources studio/resources
  [ $# -eq 0 ] && set -- -k "window_graph or captured_on_cuda"
  PYTHONPATH=/tmp/site:$PWD timeout 300 python3 -m pytest -q -p no:cacheprovider \
    tests/motion/test_fast_lmdm.py tests/engines/test_ditto_engine.py "$@" \
    >/tmp/b/logs/tests.log 2>&1
  echo "tests: exit $? ($(tail -n 1 /tmp/b/logs/tests.log))"
  save
  exit 0
fi
(while sleep 10; do save; done) &
saver=$!
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
tree=$PWD out=/tmp/b
if [ "$step" = base ]; then  # BASE_TGZ (default .base/base.tgz) into BASE_OUT (default /tmp/b2)
  tree=/tmp/base out=${BASE_OUT:-/tmp/b2}
  rm -rf "$tree" && mkdir -p "$tree" "$out" && tar -xzf "${BASE_TGZ:-.base/base.tgz}" -C "$tree"
  ln -sfn /tmp/b/cache "$out/cache"  # the same compiled engines
fi
(
  cd "$tree" && ln -sfn ../resources studio/resources && echo "$label" >studio/bench/archive_commit.txt
  export PYTHONPATH=$site:/tmp/raysite:$tree
  WARMSTART_ARGS="$*" bash scripts/bench_gpu.sh "$out" warmstart
  tail -n 12 "$out/warmstart.log"
)
kill "$saver" 2>/dev/null
save
