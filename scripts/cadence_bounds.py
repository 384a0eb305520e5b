"""Frames saved against in-between quality for pairs of cadence bounds (docs/benchmarks.md).

python scripts/cadence_bounds.py [SPEECH.wav] — the demo engine at 512², seed 0: the motion made
once, then per (plosive_guard, max_warp_px, max_pose_gap_deg, max_lid_px) the plan and every
in-between against a full render (studio.render.fidelity).
"""

from __future__ import annotations

import dataclasses
import sys

from studio.audio.io import load_audio
from studio.engines.demo.engine import DemoEngine, demo_audio_path
from studio.render.fidelity import inbetween_fidelity
from studio.render.pipeline import generate, postprocess
from studio.settings import RenderSettings

INF = 64.0  # the bound's top: nothing forced
BOUNDS = (
    (1, 32, 2.0, 2.0),
    (1, 48, 5.0, INF),
    (0, 20, 2.0, 2.0),
    (0, 24, 2.0, 2.0),
    (0, 26, 2.0, 2.0),
    (0, 28, 2.0, 2.0),
    (0, 32, 2.0, 2.0),
    (0, 48, 5.0, INF),
)


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else str(demo_audio_path())
    base = RenderSettings(size=512)
    engine = DemoEngine(base)
    audio = load_audio(path)
    phon, raw, _ = generate(engine, audio, 0)
    print("guard warp_px pose_deg lid_px saved psnr_mean psnr_p5 psnr_worst", flush=True)
    for guard, warp, pose, lid in BOUNDS:
        cadence = dataclasses.replace(
            base.cadence,
            plosive_guard=guard,
            max_warp_px=warp,
            max_pose_gap_deg=pose,
            max_lid_px=lid,
        )
        s = base.replace(cadence=cadence)
        result = postprocess(audio, phon, raw, s)
        f = inbetween_fidelity(result, engine.renderer(s), max_frames=None, warmup=False)
        p = f["psnr_db"]
        psnr = " ".join(f"{p[k]:.1f}" for k in ("mean", "p5", "worst"))
        print(f"{guard} {warp} {pose} {lid} {f['frames_saved']:.3f} {psnr}", flush=True)


if __name__ == "__main__":
    main()
