"""Which step shapes replay a CUDA graph (the CPU can check the bookkeeping; tests/gpu runs the graphs).

`ModelRunner.capture_ahead` must name every steady shape of its role: a verifier's windows of 1..k+1
tokens scored at every position, a drafter's feeds of 1..k+1 tokens scored at the last, for every batch
bucket up to the bound; once they are captured the set is closed, and any other shape runs eagerly (logged
once per shape) instead of being captured while serving."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pytest
import torch

from minedraft.bundled import TINY_TARGET
from minedraft.engine.cuda_graphs import BATCH_BUCKETS, GraphCache
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner


class RecordingCache(GraphCache):
    """A GraphCache whose captures only record their key (no CUDA on this machine)."""

    def __init__(self) -> None:
        super().__init__(lambda *args: torch.zeros(0), torch.device("cpu"), max_blocks_per_seq=64)
        self.order: list[tuple[int, int, int]] = []

    def _capture(self, key: tuple[int, int, int]):  # type: ignore[override]
        self.order.append(key)
        self.steps[key] = object()  # type: ignore[assignment]


def runner_with(cache: GraphCache) -> ModelRunner:
    runner = ModelRunner(load_model(TINY_TARGET, "cpu", torch.float32), 16, 16, "cpu")
    assert runner.graphs is None  # no graphs on a CPU: capture_ahead is a no-op there
    assert runner.capture_ahead(64, 4, scoring=True) == 0
    runner.graphs = cache
    return runner


def keys(buckets: Iterable[int], widths: Iterable[int], scoring: bool) -> list[tuple[int, int, int]]:
    return [(b, w, w if scoring else 1) for b in buckets for w in widths]


def test_capture_ahead_names_every_steady_shape_of_each_role() -> None:
    verifier, drafter = RecordingCache(), RecordingCache()
    assert runner_with(verifier).capture_ahead(8, 2, scoring=True) == 12
    assert verifier.order == keys((1, 2, 4, 8), (1, 2, 3), scoring=True)  # AR (1 token) and k = 1, 2 windows
    assert runner_with(drafter).capture_ahead(20, 3, scoring=False) == 24
    assert drafter.order == keys((1, 2, 4, 8, 16, 24), (1, 2, 3, 4), scoring=False)  # 20 rounds up to 24
    big = RecordingCache()
    assert runner_with(big).capture_ahead(1000, 20, scoring=False) == len(BATCH_BUCKETS) * 16  # at most 16 wide
    again = runner_with(big)
    assert again.capture_ahead(1000, 20, scoring=False) == 0  # all there already


def test_a_closed_set_replays_only_its_shapes_and_says_once_what_runs_eagerly(caplog) -> None:
    cache = RecordingCache()
    assert cache.can_replay(3, 5, 1, 10) and not cache.can_replay(3, 17, 1, 10)  # open: any shape that fits
    assert not cache.can_replay(300, 1, 1, 10) and not cache.can_replay(3, 2, 3, 10)
    cache.capture_ahead(keys((1, 2, 4), (1, 2, 3), scoring=True))
    assert cache.closed
    assert cache.can_replay(3, 3, 3, 10) and cache.can_replay(1, 1, 1, 10)
    with caplog.at_level(logging.INFO, logger="minedraft.engine.cuda_graphs"):
        assert not cache.can_replay(3, 9, 1, 10)  # a short prompt's prefill
        assert not cache.can_replay(4, 9, 1, 10)  # the same bucket: said once
        assert not cache.can_replay(8, 2, 2, 10)  # a batch past the bound
    eager = [r.getMessage() for r in caplog.records if "runs eagerly" in r.getMessage()]
    assert len(eager) == 2 and "4 sequences x 9 tokens" in eager[0] and "8 sequences x 2 tokens" in eager[1]
    assert cache.order == keys((1, 2, 4), (1, 2, 3), scoring=True)  # nothing captured after the set closed


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_bucket_rounds_up(batch: int) -> None:
    bucket = GraphCache.bucket(batch)
    assert bucket is not None and bucket >= batch and all(b < batch for b in BATCH_BUCKETS if b < bucket)
