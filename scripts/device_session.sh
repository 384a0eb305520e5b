#!/usr/bin/env bash
# Issue 20's standard measurement in one device call (about 7 minutes of an H200's time): the
# CUDA tests of LMDM's window graphs, the compiled artifacts built in process (an 11 s
# render), then 10 s and 60 s renders sampled by py-spy (`--sample`: every thread, waits
# included) with LMDM in fp32 and then in fp16 (`--motion-precision fp16`), then unsampled on
# eager engines (`--no-compile`). Prepare here first:
#   bash scripts/gpu_wheels.sh                       # .whl (py-spy among them)
#   mkdir -p .base && git archive HEAD | gzip -n > .base/base.tgz
# then, through the device tool (carry .whl and .base):
#   bash scripts/device_session.sh "$(git rev-parse --short HEAD)"
# $OUT receives b_build.json (the build), b.json (fp32), b2.json (fp16), b3.json (eager) and
# logs.tgz (each process's log, py-spy's speedscope file and its summary, NAME.samples.txt).
set -uo pipefail
label=${1:?usage: scripts/device_session.sh LABEL}
bash scripts/device_call.sh "$label" tests
sample=--sample  # py-spy needs to read the process's memory: a container may forbid it
if ! /tmp/site/bin/py-spy record --output /tmp/spy.json --format speedscope -- python3 -c pass \
  >/tmp/spy.log 2>&1; then
  echo "py-spy cannot sample here ($(tail -n 1 /tmp/spy.log)): the renders run unsampled"
  sample=
fi
bash scripts/device_call.sh "$label" warm --clips=11 --no-prebuild --batch-jobs 0 --timeout 280
cp /tmp/b/warmstart.json "$OUT/b_build.json" 2>/dev/null
bash scripts/device_call.sh "$label" warm --clips=10,60 --no-prebuild --batch-jobs 0 $sample \
  --timeout 120
bash scripts/device_call.sh "$label-fp16" base --clips=10,60 --no-prebuild --batch-jobs 0 \
  $sample --motion-precision fp16 --timeout 120
# eager engines (no Inductor loader, so no Dynamo import): where they start sooner than the
# compiled artifacts, a short clip may be better off without them
BASE_OUT=/tmp/b3 bash scripts/device_call.sh "$label-eager" base --clips=10,60 --no-compile \
  --no-prebuild --batch-jobs 0 --timeout 120
rm -f "$OUT"/*.md
