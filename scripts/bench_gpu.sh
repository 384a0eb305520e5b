#!/usr/bin/env bash
# The GPU session in one command (about 10 minutes on an H200): the LMDM suite at T=4 with the
# window and compiled paths (flash attention among them), then the render suite on the
# renderer's own engines (studio.engines.ditto.warp_decode.WarpDecodeEngines) at B=32: the
# renderer's default with and without --compile (depth split + channel padding), the compiled
# graphs without the rewrites and with the split alone, and both kernel profiles (as loaded,
# and with the rewrites), the 165-frame clip end to end, then the CUDA tests of the render
# engines and of the render suite. Results (logs,
# JSON, Markdown, plots: about 10 files) go to $1; through the device tool, which returns at
# most 8 files, give a folder under /tmp and tar it into $OUT afterwards. Runs with the
# python3 that holds a CUDA torch; PYTHONPATH must reach the studio package (and PyAV,
# soundfile).
# The live engine's suite (streaming: first frame, latency per setting, concurrent streams, a
# 10-minute session's memory) and the in-betweens' (cadence: PSNR against full renders and the
# cost of an in-between against a keyframe, demo engine and the full-size Ditto renderer) run
# when named (BENCH_AUDIO: a speech file the cadence step measures too).
# `warmstart` (new processes against the caches on disk, and a batch) runs when named.
# Steps (lmdm render pipeline tests streaming warmstart) may be named after OUT_DIR to run only those: a device
# call lasts at most 10 minutes, so the session is two calls, e.g. `lmdm pipeline tests`
# then `render`.
set -uo pipefail
out=${1:?usage: scripts/bench_gpu.sh OUT_DIR [lmdm|render|pipeline|tests ...]}
shift
steps=" ${*:-lmdm render pipeline tests} "
want() { [[ $steps == *" $1 "* ]]; }
mkdir -p "$out"
run() {  # name, seconds, suite arguments...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m studio bench "$@" --json "$out/$name.json" \
    --markdown "$out/$name.md" >"$out/$name.log" 2>&1
  echo "$name: exit $? ($(tail -n 1 "$out/$name.log" | cut -c1-120))"
}
want lmdm && run lmdm 120 --suite lmdm --device cuda --compile --no-onnx --steps 4 \
  --paths eager_fp32,fast_fp32_window_graph,fast_fp16_window_graph,fast_bf16_window_compiled_graph,fast_bf16_window_flash_compiled_graph,fast_fp16_window_flash_compiled_graph
want render && run render 300 --suite render --device cuda --batches 32 --precisions fp16 --compile \
  --target-ms 150 --paths graph_split_padded_fp16,compiled_graph_fp16,compiled_graph_split_fp16,compiled_graph_split_padded_fp16
want streaming && run streaming 420 --suite streaming --device cuda --long-minutes 10
want cadence && run cadence 400 --suite kinematics --device cuda --repeats 1 --warmup 0 \
  --cadence-engines demo,ditto --cadence-max-frames 40 ${BENCH_AUDIO:+--audio "$BENCH_AUDIO"}
if want warmstart; then  # new processes against the caches on disk (issue 20's targets)
  # an image that writes no .pyc makes each new process compile torch's source (7.7 s on an
  # H200 machine); an installed studio has its bytecode, so compile it once here, as pip does
  [ -n "${PYTHONDONTWRITEBYTECODE:-}" ] && python3 -m compileall -q -j 0 \
    "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    ${PYTHONPATH//:/ } >/dev/null 2>&1
  # WARMSTART_ARGS: e.g. "--batch-jobs 0" for the renders alone (one device call lasts at most
  # 10 minutes); the cache under OUT_DIR is kept, so a second call finds it warm
  # each process's log is kept in $out/logs as it ends, and an internal error's log (written in
  # the cache's logs/) beside them, so a run cut off at the device's limit still says why
  run warmstart 590 --suite warmstart --device cuda --cache "$out/cache" --keep "$out/logs" \
    ${WARMSTART_ARGS:-}
  cp "$out"/cache/logs/*.log "$out/logs/" 2>/dev/null
fi
want pipeline && run pipeline 260 --suite pipeline --device cuda --compile --x264-preset veryfast --plots "$out"
want tests || exit 0
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/engines/test_warp_decode.py \
  tests/motion/test_fast_lmdm.py tests/motion/test_lmdm_hoist.py \
  tests/models/test_depth_split.py tests/models/test_channel_pad.py \
  tests/engines/test_ditto_engine.py tests/runtime/test_runtime_engines.py tests/render/test_inbetween.py \
  tests/bench/test_bench_render.py::test_cuda_graph_and_rewritten_paths_time_the_engines \
  >"$out/tests.log" 2>&1
echo "tests: exit $? ($(tail -n 1 "$out/tests.log" | cut -c1-120))"
