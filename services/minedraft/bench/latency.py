"""Latency statistics measured at the client: percentiles of TTFTs and of the gaps between streamed chunks.

Kept free of numpy and of the services so the benchmarks' summaries test as plain functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's default), so p50 of
    an even count is the mean of the middle two; 0.0 for no values, which a table then shows as such."""
    if not values:
        return 0.0
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def gaps(times: Sequence[float]) -> list[float]:
    """Differences between consecutive arrival times: what a reader of the stream waits between chunks."""
    return [b - a for a, b in pairwise(times)]


def overlapping(intervals: Sequence[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The intervals (a, b) that share time with [start, end]: the gaps a stream suffered during a window."""
    return [(a, b) for a, b in intervals if b > start and a < end]


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 2)


def seconds(values: list[float]) -> list[float]:
    """Raw timings for a results file: to the microsecond, which is finer than the clocks behind them."""
    return [round(v, 6) for v in values]
