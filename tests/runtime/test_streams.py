"""A batch analyses the next clip on a thread and stream of its own while this one renders:
a graph captured on one thread while another thread works on the GPU is still right."""

from __future__ import annotations

import threading

import pytest
import torch

from studio.runtime.base import capture_cuda_graph, own_stream


def test_without_cuda_own_stream_changes_nothing() -> None:
    with own_stream():
        assert float(torch.ones(3).sum()) == 3.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_capture_beside_another_threads_gpu_work() -> None:
    dev = torch.device("cuda")
    x = torch.randn(1024, 1024, device=dev)
    stop, sums = threading.Event(), []

    def busy() -> None:  # allocates, computes and downloads while the capture runs
        with own_stream():
            assert torch.cuda.current_stream() != torch.cuda.default_stream()
            while not stop.is_set():
                y = torch.randn(512, 512, device=dev)
                sums.append(float((y @ y).sum().cpu()))

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        graph, out = capture_cuda_graph(lambda: (x @ x).relu(), warmup=2)
        for _ in range(5):
            x.copy_(torch.randn_like(x))
            graph.replay()
            torch.testing.assert_close(out, (x @ x).relu())
    finally:
        stop.set()
        worker.join()
    assert sums and torch.cuda.current_stream() == torch.cuda.default_stream()
