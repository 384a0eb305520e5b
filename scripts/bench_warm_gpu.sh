#!/usr/bin/env bash
# Warm starts on a GPU (issue 20): new `studio render --compile` processes against the
# AOTInductor packages `studio compile --runtime torch` keeps on disk, on a full-size
# random-weight tree (cost-equivalent HuBERT, drawn face, 512² crop, x264 veryfast), and a
# video avatar's render rate against a photo's. Usage:
#   scripts/bench_warm_gpu.sh OUT_DIR SPEECH.wav [prep compile renders|warm|pair eager video ...]
# Steps are resumable (one device call lasts at most 10 minutes): a step whose result is in
# OUT_DIR is skipped. Each render prints its wall time; reports (JSON) and logs stay in OUT_DIR.
set -uo pipefail
out=${1:?usage: scripts/bench_warm_gpu.sh OUT_DIR SPEECH.wav [STEPS]}
speech=${2:?give a speech file}
shift 2
steps=" ${*:-prep compile renders eager video} "
want() { [[ $steps == *" $1 "* ]]; }
mkdir -p "$out"
export STUDIO_CACHE_DIR="$out/cache"
if want prep && [ -n "${PYTHONDONTWRITEBYTECODE:-}" ] && [ ! -f "$out/pyc.done" ]; then
  # an image that writes no .pyc makes every new process compile torch's source (7.7 s on an
  # H200 machine); an installed studio has its bytecode, so compile it once here
  python3 -m compileall -q -j 0 "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    ${PYTHONPATH//:/ } >/dev/null 2>&1
  touch "$out/pyc.done"
fi
if want prep && [ ! -f "$out/prep.done" ]; then
  python3 - "$out" "$speech" <<'PY' && touch "$out/prep.done"
import sys
from pathlib import Path
import av, numpy as np, soundfile as sf
from studio.bench.pipeline import _face_png, write_inputs
from studio.fixtures.face_standins import face_image
out, speech = Path(sys.argv[1]), sys.argv[2]
data, rate = sf.read(speech, dtype="float32", always_2d=True)
data = data.mean(axis=1)
for seconds in (10, 60):
    need = int(seconds * rate)
    sf.write(out / f"talk_{seconds}s.wav", np.tile(data, need // data.size + 1)[:need], rate)
print("hubert:", write_inputs(out / "ckpt", reduced=False, hubert="costlike")["kind"])
print("face:", _face_png(out, 512, 512))
# a 3 s video of the drawn face drifting 0.5 px a frame (near-lossless: drawn faces stay drawn)
with av.open(str(out / "face_512x512.mp4"), "w", format="mp4") as f:
    s = f.add_stream("libx264", rate=25, options={"crf": "4", "preset": "ultrafast"})
    s.width = s.height = 512
    s.pix_fmt = "yuv444p"
    for i in range(75):
        box = (146 + 0.5 * i, 105, 366 + 0.5 * i, 387)
        for p in s.encode(av.VideoFrame.from_ndarray(face_image((512, 512), [box]), format="rgb24")):
            f.mux(p)
    for p in s.encode(None):
        f.mux(p)
print("video: face_512x512.mp4, 75 frames")
PY
fi
timed() {  # name, seconds, command...: runs once (skipped when its .wall exists), prints wall
  local name=$1 limit=$2
  shift 2
  [ -f "$out/$name.wall" ] && { echo "$name: done before, wall $(cat "$out/$name.wall") s"; return; }
  local start end
  start=$(date +%s.%N)
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  end=$(date +%s.%N)
  local wall
  wall=$(python3 -c "print(round($end - $start, 2))")
  [ $rc = 0 ] && echo "$wall" >"$out/$name.wall"
  echo "$name: exit $rc, wall $wall s ($(tail -n 1 "$out/$name.log" | cut -c1-150))"
}
render() {  # name, seconds, audio, avatar, extra options...
  local name=$1 limit=$2 audio=$3 avatar=$4
  shift 4
  timed "$name" "$limit" python3 -m studio render --audio "$audio" --avatar "$avatar" \
    --checkpoints "$out/ckpt" --frame crop --size 512 --x264-preset veryfast \
    --out "$out/$name.mp4" --report "$out/$name.json" "$@"
}
face="$out/face_512x512.png"
want compile && timed compile 560 python3 -m studio compile --runtime torch \
  --checkpoints "$out/ckpt" --json "$out/compile.json"
if want renders; then
  render first10 200 "$out/talk_10s.wav" "$face" --compile  # packages on disk, nothing else warm
  render warm10 120 "$out/talk_10s.wav" "$face" --compile
  render warm60 200 "$out/talk_60s.wav" "$face" --compile
  render warm10b 120 "$out/talk_10s.wav" "$face" --compile
fi
if want pair; then  # the shortest: a first process builds what it needs, a second loads it
  render first10 200 "$out/talk_10s.wav" "$face" --compile
  render warm10 120 "$out/talk_10s.wav" "$face" --compile
fi
if want warm; then  # the short form: the first two new processes after `studio compile`
  render warm10 120 "$out/talk_10s.wav" "$face" --compile
  render warm60 200 "$out/talk_60s.wav" "$face" --compile
fi
want eager && render eager60 200 "$out/talk_60s.wav" "$face"
if want video; then
  render photo10 120 "$out/talk_10s.wav" "$face" --compile
  render video10 200 "$out/talk_10s.wav" "$out/face_512x512.mp4" --compile  # registers the video
  render video10b 120 "$out/talk_10s.wav" "$out/face_512x512.mp4" --compile
fi
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for rep in sorted(out.glob("*.json")):
    try:
        r = json.loads(rep.read_text())
    except ValueError:
        continue
    if not isinstance(r, dict) or "timings_ms" not in r and "warmup_ms" not in r:
        continue
    keep = {k: r.get(k) for k in ("frames", "render_fps", "warmup_ms", "timings_ms")}
    print(rep.stem, json.dumps(keep)[:600])
PY
