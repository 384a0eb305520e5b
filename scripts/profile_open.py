"""What opening the Ditto engine's files costs a new process (issue 20's warm starts).

Usage: python scripts/profile_open.py [TREE]

Each figure is a fresh interpreter: ``import torch`` alone, the six networks read with
``studio.models.load_network`` (on the CPU), and HuBERT's ONNX file made into its torch runner
(``HubertFeatures(..., device="cpu")``: what a GPU process does on its device). TREE is a
checkpoint tree of the released layout; without it a full-size random-weight one with a
cost-equivalent HuBERT is written to a temporary folder first. Run it at two commits (a git
worktree each) to compare them on one machine.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

STEPS = {
    "import torch": "import torch",
    "six networks": (
        "from studio.models import NETWORK_NAMES, load_network, network_spec\n"
        "models = Path(TREE) / 'ditto_pytorch' / 'models'\n"
        "for n in NETWORK_NAMES:\n"
        "    load_network(n, models / network_spec(n).checkpoint_file)"
    ),
    "HuBERT torch runner": (
        "from studio.audio.features import HubertFeatures\n"
        "HubertFeatures(Path(TREE) / 'ditto_pytorch' / 'aux_models' / "
        "'hubert_streaming_fix_kv.onnx', device=torch.device('cpu'))"
    ),
}


def timed(tree: str, code: str) -> float:
    """Seconds ``code`` takes in a new interpreter that has imported torch already."""
    script = (
        "import sys, time\nfrom pathlib import Path\nimport torch\n"
        f"TREE = {tree!r}\nt = time.perf_counter()\n{code}\n"
        "print(time.perf_counter() - t)"
    )
    if code == "import torch":
        script = f"import time\nt = time.perf_counter()\n{code}\nprint(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tree = sys.argv[1] if len(sys.argv) > 1 else None
        if tree is None:
            from studio.bench.pipeline import write_inputs

            tree = str(Path(tmp) / "ckpt")
            write_inputs(Path(tree), reduced=False, hubert="costlike")
        for name, code in STEPS.items():
            runs = sorted(timed(tree, code) for _ in range(3))
            print(f"{name}: {runs[1]:.2f} s (median of 3; {runs[0]:.2f}-{runs[2]:.2f})")


if __name__ == "__main__":
    main()
