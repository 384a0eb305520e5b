#!/usr/bin/env bash
# The GPU session in one command (under 10 minutes on an H200): the tests that need CUDA,
# then the render suite at every batch with its kernel profile, the LMDM suite with the
# window-constant and compiled paths, and the 165-frame clip end to end. Results (logs, JSON,
# Markdown, plots: about 13 files) go to $1; through the device tool, which returns at most 8
# files, give a folder under /tmp and tar it into $OUT afterwards. Runs with the python3 that
# holds a CUDA torch; PYTHONPATH must reach the studio package (and PyAV, soundfile).
set -uo pipefail
out=${1:?usage: scripts/bench_gpu.sh OUT_DIR}
mkdir -p "$out"
run() {  # name, seconds, suite arguments...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m studio bench "$@" --json "$out/$name.json" \
    --markdown "$out/$name.md" >"$out/$name.log" 2>&1
  echo "$name: exit $? ($(tail -n 1 "$out/$name.log" | cut -c1-120))"
}
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_runtime_engines.py \
  tests/test_warp_decode.py tests/test_ditto_engine.py tests/test_hubert_torch.py \
  tests/test_stitch.py tests/test_putback.py >"$out/tests.log" 2>&1
echo "tests: exit $? ($(tail -n 1 "$out/tests.log" | cut -c1-120))"
run render 200 --suite render --device cuda --batches 1,4,8,16,32 --precisions fp16,bf16 \
  --compile --target-ms 150 --plots "$out" \
  --paths eager_fp16,graph_fp16,compiled_graph_fp16,compiled_graph_channels_last_fp16
run lmdm 120 --suite lmdm --device cuda --compile --no-onnx \
  --paths eager_fp32,fast_fp32_window_graph,fast_fp16_window_graph,fast_bf16_window_graph,fast_bf16_window_compiled_graph,fast_fp16_window_compiled_graph
run pipeline 170 --suite pipeline --device cuda --compile --x264-preset veryfast --plots "$out"
