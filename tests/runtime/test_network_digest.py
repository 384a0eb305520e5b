"""What identifies a network to the caches: its weights' digest and its code's."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path

import pytest
import torch
from torch import nn

from studio.runtime import aot_cache
from studio.runtime.network_digest import code_sha256, weights_sha256
from studio.runtime.onnx_cache import onnx_cache_key

NET = """
from torch import nn
from .helpers import scale

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.register_buffer("offset", torch.zeros(4))

    def forward(self, x):
        return scale(self.conv(x))

import torch
"""


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a package ``name``: a network whose forward calls a helper of its package, whose
    constant comes from a third module (two imports away)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, helper: str = "x * FACTOR", factor: int = 2) -> type[nn.Module]:
        root = tmp_path / name
        root.mkdir()
        (root / "__init__.py").write_text("")
        (root / "consts.py").write_text(f"FACTOR = {factor}\n")
        (root / "helpers.py").write_text(
            "from .consts import (  # a parenthesised list\n    FACTOR,\n)\n\n"
            f"def scale(x):\n    return {helper}\n"
        )
        (root / "net.py").write_text(NET)
        return importlib.import_module(f"{name}.net").Net

    return write


def test_the_weights_digest_follows_names_and_bytes_not_the_module() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    same = copy.deepcopy(net)
    assert weights_sha256(same) == weights_sha256(net)
    changed = copy.deepcopy(net)
    with torch.no_grad():
        changed[1].running_mean[0] += 1.0  # a buffer counts as a weight does
    assert weights_sha256(changed) != weights_sha256(net)
    renamed = nn.Sequential(nn.Identity(), *copy.deepcopy(net))  # the same tensors, other names
    assert weights_sha256(renamed) != weights_sha256(net)
    half = copy.deepcopy(net).half()
    assert weights_sha256(half) != weights_sha256(net)


def test_the_code_digest_follows_the_networks_source_and_what_it_imports(package) -> None:
    a = package("netcode_a")()
    same = package("netcode_b")()  # the same code in another place
    helper = package("netcode_c", helper="x * FACTOR + 0")()  # the helper the forward calls
    factor = package("netcode_d", factor=3)()  # a constant the helper imports
    assert code_sha256(a) == code_sha256(same)
    assert len({code_sha256(m) for m in (a, helper, factor)}) == 3
    with torch.no_grad():  # the same weights: only the code tells them apart
        factor.load_state_dict(a.state_dict())
    assert weights_sha256(factor) == weights_sha256(a)
    cpu = torch.device("cpu")
    keys = [aot_cache.AotKey.of("net", m, "fp32", "p", 1, cpu) for m in (a, factor)]
    assert len({aot_cache.package_file("c", k) for k in keys}) == 2
    stale = aot_cache.stale_reasons(vars(keys[0]), keys[1])
    assert len(stale) == 1 and stale[0].startswith("code_sha256")
    onnx = {
        onnx_cache_key("net", weights_sha256(m), 1, "fp32", 17, "Net", code_sha256(m))
        for m in (a, factor)
    }
    assert len(onnx) == 2


def test_a_compiled_warp_network_is_digested_with_what_builds_it() -> None:
    """The adapter-wrapped, rewritten warp network a compiled engine keys: its blocks, the
    constants, the rewrites, the adapter and the grid sampling its package is exported with;
    an export adds its exporter. Only the studio's files (torch's are its version)."""
    from studio.fixtures.random_tree import random_network
    from studio.models.channel_pad import pad_conv_channels
    from studio.models.depth_split import split_deep_conv3d
    from studio.runtime.network_digest import _code_modules, _source_files
    from studio.runtime.torch_backend import PrecisionAdapter

    warp = random_network("warp_network", reduced=True, seed=0)
    rewritten = pad_conv_channels(split_deep_conv3d(warp), 8)
    adapter = PrecisionAdapter("warp_network", rewritten, "fp32", torch.device("cpu"), None)
    files = {
        str(Path(f).relative_to(Path(f).parents[1])) for f in _source_files(_code_modules(adapter))
    }
    wanted = {"models/warp_network.py", "models/blocks.py", "studio/layout.py"}
    wanted |= {"models/depth_split.py", "models/channel_pad.py", "runtime/torch_backend.py"}
    assert wanted | {"runtime/grid_gather.py"} <= files
    exported = _source_files(frozenset((*_code_modules(warp), "studio.runtime.onnx_cache")))
    assert {"onnx_cache.py", "onnx_export.py"} <= {Path(f).name for f in exported}
    assert all("studio" in Path(f).parts for f in exported)
