#!/usr/bin/env bash
# `studio batch` on a GPU (issue 20): N one-minute clips (the fixture speech, repeated) through
# one warm Ditto engine on a full-size random-weight tree with a cost-equivalent HuBERT and a
# drawn face, 512² crop, x264 veryfast; then the same with --compile. Usage:
#   scripts/bench_batch_gpu.sh OUT_DIR SPEECH.wav [CLIPS=20] [SECONDS=60] [EXTRA studio batch options]
# MODES (default "plain compile") picks the runs ("ahead": plain with the next job analysed
# beside each render, studio.batch.run.AHEAD on; "ahead-compile" likewise with --compile); PROCS=N (default 1) splits the jobs over N
# concurrent `studio batch` processes on the one GPU (what N Ray actors on it would do).
# Prints each run's summary line and leaves batch_report.json files under OUT_DIR. The tree's
# weights are deterministic: with STUDIO_CACHE_DIR shared, compiled packages built for it by
# `scripts/bench_gpu.sh OUT warmstart` are reused.
set -uo pipefail
out=${1:?usage: scripts/bench_batch_gpu.sh OUT_DIR SPEECH.wav [CLIPS] [SECONDS]}
speech=${2:?give a speech file}
clips=${3:-20}
seconds=${4:-60}
shift 4 2>/dev/null || shift $#
mkdir -p "$out"
python3 - "$out" "$speech" "$clips" "$seconds" <<'PY'
import json, sys
from pathlib import Path
import numpy as np, soundfile as sf
from studio.bench.pipeline import _face_png, write_inputs
out, speech, clips, seconds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
data, rate = sf.read(speech, dtype="float32", always_2d=True)
data = data.mean(axis=1)
need = int(seconds * rate)
(out / "clips").mkdir(exist_ok=True)
with open(out / "jobs.jsonl", "w") as jobs:
    for i in range(clips):
        clip = np.roll(np.tile(data, need // data.size + 1), -i * rate // 3)[:need]
        sf.write(out / "clips" / f"talk_{i:02d}.wav", clip, rate)
        jobs.write(json.dumps({"audio": str((out / "clips" / f"talk_{i:02d}.wav").resolve())}) + "\n")
if not (out / "ckpt").is_dir():  # deterministic weights: a tree written before is the same
    print("hubert:", write_inputs(out / "ckpt", reduced=False, hubert="costlike")["kind"])
print("face:", _face_png(out, 512, 512))
PY
procs=${PROCS:-1}
rm -f "$out"/part_*
split -n l/"$procs" -d --additional-suffix=.jsonl "$out/jobs.jsonl" "$out/part_"
for mode in ${MODES:-plain compile}; do
  flag=""; [[ $mode == *compile ]] && flag="--compile"
  ahead=False; [[ $mode == ahead* ]] && ahead=True
  start=$(date +%s.%N)
  pids=()
  for part in "$out"/part_*.jsonl; do
    n=$(basename "$part" .jsonl)
    timeout 900 python3 -c "import sys, studio.batch.run as r; r.AHEAD = $ahead; from studio.cli import main; sys.exit(main(sys.argv[1:]))" batch "$part" --out-dir "$out/$mode/$n" \
      --checkpoints "$out/ckpt" --avatar "$out/face_512x512.png" --frame crop --size 512 \
      --x264-preset veryfast $flag "$@" >"$out/$mode.$n.log" 2>&1 &
    pids+=($!)
  done
  status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  end=$(date +%s.%N)
  echo "$mode x $procs processes: exit $status, wall $(python3 -c "print(round($end - $start, 1))") s"
  grep -hE "^[0-9]+ done" "$out/$mode".*.log
  grep -h "FAILED" "$out/$mode".*.log | cut -c1-400 | head -n 5  # each failed job, one line
done
