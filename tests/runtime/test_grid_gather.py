"""3-D grid sampling as gathers (studio.runtime.grid_gather): what F.grid_sample computes, and
swapped in only where it computes the same."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from studio.runtime.grid_gather import GatheredGridSample, grid_sample_3d


def _sample(volume: torch.Tensor, grid: torch.Tensor, **kw) -> torch.Tensor:
    kw = {"mode": "bilinear", "padding_mode": "zeros", "align_corners": False} | kw
    return F.grid_sample(volume, grid, **kw)


def test_the_same_samples_as_grid_sample_inside_and_outside_the_volume() -> None:
    torch.manual_seed(0)
    volume = torch.randn(2, 5, 6, 7, 8)  # D, H, W all different: the axes cannot be mixed up
    grid = torch.rand(2, 3, 4, 9, 3) * 2.6 - 1.3  # some points outside: zeros padding
    want = _sample(volume, grid)
    assert torch.allclose(grid_sample_3d(volume, grid), want, atol=1e-6)
    with GatheredGridSample():
        assert torch.allclose(_sample(volume, grid), want, atol=1e-6)


class _Warp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(4, 4, 3, padding=1)

    def forward(self, volume: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return _sample(self.conv(volume), grid)


def test_an_export_under_the_mode_holds_gathers_not_grid_sampler_3d() -> None:
    torch.manual_seed(0)
    net, example = _Warp().eval(), (torch.randn(1, 4, 4, 8, 8), torch.rand(1, 4, 8, 8, 3) * 2 - 1)
    with torch.no_grad():
        plain = torch.export.export(net, example)
        with GatheredGridSample():
            gathered = torch.export.export(net, example)
    def ops(exported: torch.export.ExportedProgram) -> set[str]:
        return {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}

    assert any("grid_sampler" in op for op in ops(plain))
    assert not any("grid_sampler" in op for op in ops(gathered))
    assert "aten.gather.default" in ops(gathered)
    with torch.no_grad():
        assert torch.allclose(gathered.module()(*example), net(*example), atol=1e-6)


def test_other_sampling_is_left_to_grid_sample() -> None:
    torch.manual_seed(0)
    image, grid2 = torch.randn(1, 3, 5, 5), torch.rand(1, 4, 4, 2) * 2 - 1
    volume, grid3 = torch.randn(1, 2, 3, 4, 5), torch.rand(1, 2, 2, 2, 3) * 2 - 1
    with GatheredGridSample():  # 2-D, nearest, border padding, align_corners: not its case
        cases = [
            (_sample(image, grid2), F.grid_sample(image, grid2, align_corners=False)),
            (_sample(volume, grid3, mode="nearest"), None),
            (_sample(volume, grid3, padding_mode="border"), None),
            (_sample(volume, grid3, align_corners=True), None),
        ]
    assert torch.equal(*cases[0])
    assert torch.equal(cases[1][0], _sample(volume, grid3, mode="nearest"))
    assert torch.equal(cases[2][0], _sample(volume, grid3, padding_mode="border"))
    assert torch.equal(cases[3][0], _sample(volume, grid3, align_corners=True))


def test_under_autocast_it_samples_in_fp32_as_autocast_does() -> None:
    torch.manual_seed(0)
    volume = torch.randn(1, 3, 4, 5, 6).bfloat16()
    grid = (torch.rand(1, 2, 3, 4, 3) * 2 - 1).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = _sample(volume, grid)
        with GatheredGridSample():
            got = _sample(volume, grid)
    assert want.dtype == got.dtype == torch.float32
    assert torch.allclose(got, want, atol=1e-5)


def test_keyword_arguments_are_read_like_positional_ones() -> None:
    torch.manual_seed(0)
    volume, grid = torch.randn(1, 2, 3, 4, 5), torch.rand(1, 2, 2, 2, 3) * 2 - 1
    with GatheredGridSample():
        got = F.grid_sample(input=volume, grid=grid, align_corners=False)
    assert torch.allclose(got, _sample(volume, grid), atol=1e-6)
