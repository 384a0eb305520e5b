"""Shared test setup: Qt runs offscreen (without a display Qt aborts), and tensor helpers."""

import contextlib
import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

HOST_READS = ("item", "tolist", "cpu", "numpy")


@pytest.fixture(scope="module")
def one_torch_thread():
    """Reduced networks are tiny: extra threads only add overhead (and stall on busy CI)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def host_reads():
    """``with host_reads(names) as calls:`` records every Tensor method in ``names`` called
    inside the block (reads that would sync a GPU with the host); they still work."""
    import torch

    @contextlib.contextmanager
    def guard(names=HOST_READS):
        calls: list[str] = []
        with pytest.MonkeyPatch.context() as mp:
            for name in names:
                orig = getattr(torch.Tensor, name)

                def spy(self, *a, _orig=orig, _name=name, **k):
                    calls.append(_name)
                    return _orig(self, *a, **k)

                mp.setattr(torch.Tensor, name, spy)
            yield calls

    return guard
