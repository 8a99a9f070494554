"""Step graphs are captured with the cycle collector paused (engine/cuda_graphs.py, `collector_paused`): a
collection that frees other graphs mid-capture destroys them while the stream captures, which the driver
refuses ("operation not permitted when stream is capturing") and the capture is lost. Here a cycle holding a
captured graph becomes unreachable mid-capture with the collector set to run at every allocation: the
collector is off for the capture, on again after it, and the graph replays what it captured."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

from minedraft.engine.cuda_graphs import GraphCache


@pytest.fixture
def eager_collector() -> Iterator[None]:
    """The collector runs at every allocation of a container while the test runs."""
    gc.collect()
    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.collect()


def graph_cycle(device: torch.device) -> list[object]:
    """A holder of a reference cycle that holds a captured graph: once the holder is cleared, only the
    collector can free the graph."""
    x = torch.ones(8, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
    cycle: list[object] = [graph]
    cycle.append(cycle)
    return [cycle]


def step_that_allocates(x: torch.Tensor) -> torch.Tensor:
    junk = [[i] for i in range(64)]  # containers: the collector runs (threshold 1)
    assert junk
    return x * 2


def test_a_capture_survives_the_collector_freeing_other_graphs(cuda_device: torch.device,
                                                               eager_collector: None) -> None:
    cache = GraphCache(lambda *args: None, cuda_device, 1)  # type: ignore[arg-type]
    x = torch.arange(8.0, device=cuda_device)
    seen = []

    holder = graph_cycle(cuda_device)

    def step() -> torch.Tensor:
        seen.append(gc.isenabled())
        if torch.cuda.is_current_stream_capturing():
            holder.clear()  # the cycle becomes garbage mid-capture
        return step_that_allocates(x)

    graph, out = cache.capture(step)
    x.fill_(3.0)
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [6.0] * 8
    assert seen[-1] is False and gc.isenabled()  # off during the capture, on again after
