"""What identifies a network to the caches: its weights' digest and its code's."""

from __future__ import annotations

import copy
import importlib
import sys
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
    """Write a package ``name`` (a network whose forward calls a helper of its package)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, helper: str) -> type[nn.Module]:
        root = tmp_path / name
        root.mkdir()
        (root / "__init__.py").write_text("")
        (root / "helpers.py").write_text(f"def scale(x):\n    return {helper}\n")
        (root / "net.py").write_text(NET)
        monkeypatch.delitem(sys.modules, f"{name}.net", raising=False)
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


def test_the_code_digest_follows_the_networks_source_and_its_packages_helpers(package) -> None:
    a = package("netcode_a", "x * 2")()
    same = package("netcode_b", "x * 2")()  # the same files in another place
    other = package("netcode_c", "x * 3")()  # only the helper the forward calls differs
    assert code_sha256(a) == code_sha256(same)
    assert code_sha256(other) != code_sha256(a)
    with torch.no_grad():  # the same weights: only the code tells the two apart
        other.load_state_dict(a.state_dict())
    assert weights_sha256(other) == weights_sha256(a)
    cpu = torch.device("cpu")
    keys = [aot_cache.AotKey.of("net", m, "fp32", "p", 1, cpu) for m in (a, other)]
    assert len({aot_cache.package_file("c", k) for k in keys}) == 2
    stale = aot_cache.stale_reasons(vars(keys[0]), keys[1])
    assert len(stale) == 1 and stale[0].startswith("code_sha256")
    onnx = {
        onnx_cache_key("net", weights_sha256(m), 1, "fp32", 17, "Net", code_sha256(m))
        for m in (a, other)
    }
    assert len(onnx) == 2


def test_a_studio_network_is_digested_with_its_blocks() -> None:
    from studio.fixtures.random_tree import random_network
    from studio.runtime.network_digest import _code_modules, _source_files

    files = _source_files(_code_modules(random_network("warp_network", reduced=True, seed=0)))
    assert {"warp_network.py", "blocks.py"} <= {Path(f).name for f in files}
    assert all("studio" in Path(f).parts for f in files)  # torch's own files are its version's
