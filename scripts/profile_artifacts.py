"""Would Inductor's standalone artifacts start compiled render engines faster? (issue 20)

Usage (on a CUDA GPU): python scripts/profile_artifacts.py [TREE] [--batch 32]

On torch 2.11 no AOTInductor package loads on the GPUs lent here (benchmarks 2026-12-05), so a
new ``--compile`` process builds its engines through Dynamo from Inductor's caches: 15.3 s on
an H100 for warp + decoder at batch 32 (2026-12-06). ``torch._inductor.standalone_compile``
saves an exported graph's compiled code (Python wrapper and Triton kernels, no C++ library to
load) that a later process loads without tracing. Each step below is a new interpreter against
one Inductor/Triton cache folder; warp + decoder as the renderer builds them (fp16, depth
split, channel padding), the warp network exported with its 3-D sampling as gathers:

- ``compile (cold)`` and ``compile (warm)``: ``WarpDecodeEngines(..., compile=True)`` without
  packages, batch ``--batch``: today's path, an empty cache then a filled one;
- ``artifact build``: both networks exported, ``standalone_compile``-d and saved;
- ``artifact load``: both loaded, run once, then captured in a CUDA graph and replayed; the
  largest difference from the eager networks.

TREE: a checkpoint tree of the released layout (default: a full-size random-weight one).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = ("compile (cold)", "compile (warm)", "artifact build", "artifact load")


def _engines(tree: str, batch: int):  # noqa: ANN202 - the step's own objects
    import torch

    from studio.engines.ditto.engine import load_networks
    from studio.engines.ditto.warp_decode import WarpDecodeEngines
    from studio.models.checkpoints import discover

    nets = load_networks(discover(tree), torch.device("cuda"))
    return WarpDecodeEngines(
        nets.warp, nets.decoder, "fp16", torch.device("cuda"), compile=True, aot_dir=None
    )


def step(name: str, tree: str, batch: int, folder: Path) -> str:
    """One step in this process; a line of figures."""
    import torch

    from studio.runtime.grid_gather import GatheredGridSample

    wd = _engines(tree, batch)
    t0 = time.perf_counter()
    if name.startswith("compile"):
        wd.engines(batch)
        torch.cuda.synchronize()
        return f"{name}: engines built and captured in {time.perf_counter() - t0:.2f} s"
    if name == "artifact build":
        for net in ("warp_network", "decoder"):
            adapter = wd._module(net)
            example = adapter.example_inputs(batch)
            with torch.no_grad(), GatheredGridSample():
                ep = torch.export.export(adapter, example)
            weights = {**dict(adapter.named_parameters()), **dict(adapter.named_buffers())}
            names = [s.target for s in ep.graph_signature.input_specs]
            user = iter(example)
            args = [weights[n] if n in weights else next(user) for n in names]
            with torch.no_grad():
                art = torch._inductor.standalone_compile(
                    ep.graph_module, args, dynamic_shapes="from_example_inputs"
                )
            art.save(path=str(folder / net), format="binary")
            torch.save(names, folder / f"{net}.names")
        return f"{name}: both networks in {time.perf_counter() - t0:.2f} s"
    from torch._inductor import CompiledArtifact

    lines = []
    for net in ("warp_network", "decoder"):
        t1 = time.perf_counter()
        art = CompiledArtifact.load(path=str(folder / net), format="binary")
        loaded = time.perf_counter() - t1
        adapter = wd._module(net)
        example = adapter.example_inputs(batch)
        weights = {**dict(adapter.named_parameters()), **dict(adapter.named_buffers())}
        names = torch.load(folder / f"{net}.names")
        user = iter(example)
        args = [weights[n] if n in weights else next(user) for n in names]
        with torch.no_grad():
            out = art(*args)
            torch.cuda.synchronize()
            first = time.perf_counter() - t1 - loaded
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = art(*args)
            graph.replay()
            torch.cuda.synchronize()
            want = adapter(*example)
        want = want if isinstance(want, (list, tuple)) else (want,)
        pairs = zip(out, want, strict=True)
        diff = max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
        again = max(float((a - b).abs().max()) for a, b in zip(captured, out, strict=True))
        lines.append(
            f"{net}: load {loaded:.2f} s, first call {first:.2f} s, largest difference from "
            f"eager {diff:.3g}, captured replay vs first call {again:.3g}"
        )
    return f"{name}: {time.perf_counter() - t0:.2f} s in all; " + "; ".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tree", nargs="?")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.step:
        print(step(args.step, args.tree, args.batch, Path(args.folder)), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        tree = args.tree
        if tree is None:
            from studio.bench.pipeline import write_inputs

            tree = str(Path(tmp) / "ckpt")
            write_inputs(Path(tree), reduced=False, hubert="costlike")
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor"),
            "TRITON_CACHE_DIR": str(Path(tmp) / "triton"),
        }
        for name in STEPS:
            cmd = [sys.executable, __file__, tree, "--batch", str(args.batch), "--step", name]
            t0 = time.perf_counter()
            run = subprocess.run([*cmd, "--folder", tmp], env=env, capture_output=True, text=True)
            last = (run.stdout.strip().splitlines() or run.stderr.strip().splitlines() or [""])[-1]
            print(f"[{time.perf_counter() - t0:.1f} s, exit {run.returncode}] {last}", flush=True)


if __name__ == "__main__":
    main()
