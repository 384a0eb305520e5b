"""Frames saved against in-between quality for pairs of cadence bounds (docs/benchmarks.md).

python scripts/cadence_bounds.py [SPEECH.wav] — the demo engine at 512², seed 0: the motion made
once, then per (max_warp_px, max_pose_gap_deg) the plan and up to 60 in-betweens against full
renders (studio.render.fidelity).
"""

from __future__ import annotations

import dataclasses
import sys

from studio.audio.io import load_audio
from studio.engines.demo.engine import DemoEngine, demo_audio_path
from studio.render.fidelity import inbetween_fidelity
from studio.render.pipeline import generate, postprocess
from studio.settings import RenderSettings

BOUNDS = ((8, 1.5), (10, 2.0), (12, 2.0), (16, 3.0), (24, 3.0), (32, 5.0))


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else str(demo_audio_path())
    base = RenderSettings(size=512)
    engine = DemoEngine(base)
    audio = load_audio(path)
    phon, raw, _ = generate(engine, audio, 0)
    print("warp_px pose_deg saved psnr_mean psnr_p5 psnr_worst")
    for warp, pose in BOUNDS:
        cadence = dataclasses.replace(base.cadence, max_warp_px=warp, max_pose_gap_deg=pose)
        s = base.replace(cadence=cadence)
        result = postprocess(audio, phon, raw, s)
        f = inbetween_fidelity(result, engine.renderer(s), max_frames=60, warmup=False)
        p = f["psnr_db"]
        psnr = " ".join(f"{p[k]:.1f}" for k in ("mean", "p5", "worst"))
        print(f"{warp} {pose} {f['frames_saved']:.3f} {psnr}")


if __name__ == "__main__":
    main()
