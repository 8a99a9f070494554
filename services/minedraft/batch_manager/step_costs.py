"""Measured step costs for adaptive k (adaptive_k.py): moving averages of the workers' compute ms.

A draft step runs k forwards of the batch one after another, so its cost is kept by k and batch size
(in power-of-two buckets). A verify step checks b(k+1) tokens in one forward, and that count is what
its cost follows: flat while the weights' read dominates, then rising as the forward turns compute-
bound (two H200s, 8B pair: 5.9-6.2 ms from 48 to 112 tokens, 6.8 ms at 160, 8.2 ms at 224). Kept by
(b, k) bucket instead, one bucket mixes batches of 33 and 64 sequences, and a k measured while the
batch was full looked dearer than one measured as it emptied. Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field

COST_EMA = 0.2
TOKEN_BINS_PER_DOUBLING = 4  # verify costs are kept in bins ~19% apart in tokens


@dataclass(slots=True)
class StepCosts:
    """Moving averages of one side's compute ms per step, by k."""

    by_k: dict[int, float] = field(default_factory=dict)

    def add(self, k: int, ms: float) -> None:
        old = self.by_k.get(k)
        self.by_k[k] = ms if old is None else old + COST_EMA * (ms - old)

    def estimate(self, k: int, grows_with_k: bool) -> float | None:
        """Measured, or from the least-squares line through the measured k (None: nothing measured)."""
        if k in self.by_k:
            return self.by_k[k]
        if not self.by_k:
            return None
        if len(self.by_k) == 1:
            (k0, ms0), = self.by_k.items()
            return ms0 * k / k0 if grows_with_k else ms0
        ks, ms = list(self.by_k), list(self.by_k.values())
        mk, mm = sum(ks) / len(ks), sum(ms) / len(ms)
        slope = sum((a - mk) * (b - mm) for a, b in zip(ks, ms, strict=True)) / sum((a - mk) ** 2 for a in ks)
        return max(0.0, mm + slope * (k - mk))


def size_bucket(batch: int) -> int:
    """Powers of two (0: size unknown). Step costs depend on the batch's size as well as on k (on a CPU
    about linearly; a GPU's verify much less), and a run's tail shrinks the batches: costs learnt on
    small batches must not stand for full ones."""
    return 1 << (batch - 1).bit_length() if batch > 0 else 0


@dataclass(slots=True)
class BucketedCosts:
    """StepCosts per batch-size bucket; a bucket not seen yet borrows the nearest one's."""

    buckets: dict[int, StepCosts] = field(default_factory=dict)
    last: int = 0  # the bucket measured most recently

    def add(self, k: int, ms: float, batch: int = 0) -> None:
        self.last = size_bucket(batch)
        self.buckets.setdefault(self.last, StepCosts()).add(k, ms)

    def table(self, batch: int = 0) -> StepCosts | None:
        if not self.buckets:
            return None
        b = size_bucket(batch) if batch > 0 else self.last
        if b in self.buckets:
            return self.buckets[b]
        return self.buckets[min(self.buckets, key=lambda key: (abs(key.bit_length() - b.bit_length()), -key))]

    def estimate(self, k: int, grows_with_k: bool, batch: int = 0) -> float | None:
        table = self.table(batch)
        return None if table is None else table.estimate(k, grows_with_k)


def near_size(batch: int) -> int:
    """A batch size rounded to ~41% steps (exact up to 4): few enough for the end rule to cost each once a plan."""
    if batch <= 4:
        return batch
    return round(2 ** (round(math.log2(batch) * 2) / 2))


@dataclass(slots=True)
class TokenCosts:
    """Moving averages of the verify's compute ms by the tokens it checks, b(k+1); between measured
    counts a line, below them the smallest (the weights' read is a floor), above them the slope of
    the last two (one measured count: flat)."""

    bins: dict[int, list[float]] = field(default_factory=dict)  # bin -> [tokens, ms], both averaged
    last_batch: int = 0
    points: list[list[float]] = field(default_factory=list)  # the bins by tokens (kept sorted on add)

    def add(self, k: int, ms: float, batch: int = 0, tokens: int | None = None) -> None:
        """`tokens`: what the verify checked when it was not b(k+1) (TETRIS left some drafts unverified)."""
        self.last_batch = batch or self.last_batch
        tokens = tokens or max(1, batch) * (k + 1)
        key = round(math.log2(tokens) * TOKEN_BINS_PER_DOUBLING)
        point = self.bins.get(key)
        if point is None:
            self.bins[key] = [float(tokens), ms]
        else:
            point[0] += COST_EMA * (tokens - point[0])
            point[1] += COST_EMA * (ms - point[1])
        self.points = sorted(self.bins.values())

    def tokens(self, k: int, batch: int = 0) -> int:
        return max(1, batch or self.last_batch) * (k + 1)

    def measured(self, k: int, batch: int = 0) -> bool:
        """The estimate at k is read between measured counts, not extrapolated."""
        if not self.bins:
            return False
        return self.points[0][0] * 0.9 <= self.tokens(k, batch) <= self.points[-1][0] * 1.1

    def estimate(self, k: int, batch: int = 0) -> float | None:
        if not self.bins:
            return None
        tokens, points = self.tokens(k, batch), self.points
        if len(points) == 1 or tokens <= points[0][0]:
            return points[0][1]
        i = min(bisect_left(points, tokens, key=lambda point: point[0]), len(points) - 1)
        (n0, ms0), (n1, ms1) = points[i - 1], points[i]
        slope = (ms1 - ms0) / max(n1 - n0, 1e-9)
        if tokens > n1:
            slope = max(slope, 0.0)  # beyond the largest count: the verify does not get cheaper
        return ms0 + slope * (tokens - n0)

    def view(self) -> dict[int, float]:
        return {round(tokens): round(ms, 3) for tokens, ms in sorted(self.bins.values())}
