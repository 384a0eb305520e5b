"""A batch analyses the next clip on a thread and stream of its own while this one renders:
a graph captured on one thread while another thread works on the GPU is still right."""

from __future__ import annotations

import threading

import pytest
import torch

from studio.runtime.base import SharedFlags, capture_cuda_graph, own_stream


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


def _flags() -> tuple[dict[str, object], SharedFlags]:
    box: dict[str, object] = {"v": "start"}
    return box, SharedFlags(lambda: box["v"], lambda v: box.__setitem__("v", v))


def test_threads_share_a_held_value_and_the_first_value_comes_back() -> None:
    box, flags = _flags()
    inside, release = threading.Barrier(2), threading.Event()

    def hold() -> None:
        with flags.hold("a"):
            inside.wait(5)
            release.wait(5)

    other = threading.Thread(target=hold)
    other.start()
    with flags.hold("a"):  # the same value: held together, no waiting
        inside.wait(5)
        assert box["v"] == "a"
    assert box["v"] == "a"  # the other thread still holds it
    release.set()
    other.join(5)
    assert box["v"] == "start"


def test_another_value_waits_until_the_holder_lets_go() -> None:
    box, flags = _flags()
    seen: list[object] = []
    held, asked = threading.Event(), threading.Event()

    def want_b() -> None:
        held.wait(5)
        asked.set()
        with flags.hold("b"):
            seen.append(box["v"])

    other = threading.Thread(target=want_b)
    other.start()
    with flags.hold("a"):
        held.set()
        asked.wait(5)
        other.join(0.3)
        assert other.is_alive() and box["v"] == "a"  # it waits: "a" stays in force
        with flags.hold("a"):  # this thread may nest its own value meanwhile
            assert box["v"] == "a"
    other.join(5)
    assert seen == ["b"] and box["v"] == "start"


def test_a_thread_nests_another_value_when_it_holds_alone() -> None:
    box, flags = _flags()
    with flags.hold("a"):
        with flags.hold("b"):
            assert box["v"] == "b"
        assert box["v"] == "a"
    assert box["v"] == "start"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_two_threads_capture_at_once_and_keep_one_stream_each() -> None:
    dev = torch.device("cuda")
    results: dict[int, tuple] = {}

    def capture(i: int) -> None:
        x = torch.randn(256, 256, device=dev)
        streams = []
        for _ in range(2):
            with own_stream():
                streams.append(torch.cuda.current_stream())
                graph, out = capture_cuda_graph(lambda: (x @ x).relu() + i, warmup=1)
                graph.replay()
                torch.cuda.current_stream().synchronize()
                results[i] = (streams, bool(torch.allclose(out, (x @ x).relu() + i)))

    threads = [threading.Thread(target=capture, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1]
    for streams, ok in results.values():
        assert ok and streams[0] == streams[1]  # one stream per thread, kept
    assert results[0][0][0] != results[1][0][0]
