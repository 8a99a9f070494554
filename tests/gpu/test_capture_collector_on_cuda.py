"""A step graph's capture survives the garbage collector freeing other graphs (engine/cuda_graphs.py,
`collector_paused`): a cycle that holds a captured graph becomes unreachable mid-capture, and the collector
is set to run at every allocation. The same capture without the pause is lost, which shows the hazard the
pause removes."""

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


def test_without_the_pause_the_collector_loses_the_capture(cuda_device: torch.device,
                                                           eager_collector: None) -> None:
    x = torch.arange(8.0, device=cuda_device)
    holder = graph_cycle(cuda_device)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="capture"), torch.cuda.graph(graph):
        holder.clear()
        step_that_allocates(x)
    torch.cuda.synchronize()  # the failed capture leaves the device usable
    assert (x + 1).tolist() == [float(i + 1) for i in range(8)]
