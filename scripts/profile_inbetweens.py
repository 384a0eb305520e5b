"""Where an in-between's time goes on a GPU (issue 19: ≤ 10% of a keyframe's render).

python scripts/profile_inbetweens.py [SPEECH.wav] — Ditto on a full-size random-weight tree
(the kinematics suite's cadence engine: a drawn face, 512² crop), driven by the demo engine's
motion; the clip made once untimed, then :func:`studio.render.fidelity.inbetween_fidelity`'s
cost split, then one more pass under torch.profiler: the top operators by GPU and by CPU time.
"""

from __future__ import annotations

import sys

import torch

from studio.audio.io import load_audio
from studio.bench.kinematics import _cadence_engine
from studio.engines.demo.engine import DemoEngine, demo_audio_path
from studio.render import pipeline
from studio.render.fidelity import inbetween_fidelity
from studio.settings import RenderSettings


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else str(demo_audio_path())
    audio = load_audio(path)
    with _cadence_engine("ditto", RenderSettings(size=512), "cuda", print) as (engine, s):
        result = pipeline.analyze(audio, s, DemoEngine(s))
        renderer = engine.renderer(s)
        f = inbetween_fidelity(result, renderer, max_frames=20)
        print("frames", f["frames"], "keyframes", f["keyframes"], "timing", f["timing"])
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in pipeline.iter_frames(result, renderer, overlap=False):
                pass
            torch.cuda.synchronize()
        table = prof.key_averages()
        print(table.table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=60))
        print(table.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
