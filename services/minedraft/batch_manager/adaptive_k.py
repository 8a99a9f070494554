"""Adaptive k for `auto` mode: each plan drafts the k expected to pay best.

Two measurements drive it, both from what the workers already report:
- acceptance by position: p[i] = P(draft i+1 is accepted | drafts 1..i were), counted from every
  verdict (a sequence that accepted n of k drafts tried positions 1..min(n+1, k) and passed the
  first n), with old evidence decaying so the estimate follows the traffic; and each running
  sequence's own acceptance, since sequences differ (its p[i] is the pooled one scaled by its ratio);
- step costs: the draft service's and the verifier's compute time per step, by k and batch size.
Expected tokens per sequence per verify with k drafts is E(k) = 1 + sum_{i<=k} prod_{j<=i} p[j]; in
PSD a step costs c(k, b) = max(draft(k), verify(k)) (the two batches overlap), in SD their sum.

While requests wait, a finished sequence is replaced at once and the batch stays full: the best k
has the most tokens per ms, sum_s E_s(k) / c(k, b). When nothing waits, the running sequences are
the work left, and what counts is when the last of them ends: a sequence with r tokens to go needs
about r / E_s(k) more steps, so with those step counts sorted, s_1 <= ... <= s_b, the batch takes

    T(k) = sum_j (s_j - s_{j-1}) * c(k, b - j + 1)

ms more, and the best k has the least T(k). The slowest sequences set T, and a long draft window
serves them worst where a full batch makes each step dear; the steady rate misses both (an equal-
length batch on one H200 ended with its slowest sequence 1.23x after its mean one at k = 5).
Costs of a k not yet measured come from a line through the measured ones (draft time grows with k,
the k sequential draft forwards; verify time barely moves), or, with one measured k only, from
draft ~ k and verify flat. Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

DECAY = 0.995  # per verified sequence: evidence ~200 sequences old counts e^-1 as much
PRIOR_TRIES = 8.0  # pseudo-counts pulling a sparsely seen position towards the pooled acceptance
PRIOR_P = 0.8  # optimistic start (2 pseudo-counts in the pool), so unseen positions get tried
COST_EMA = 0.2
SEQ_PRIOR_TRIES = 8.0  # pseudo-counts pulling a young sequence's acceptance towards the pooled one
P_CAP = 0.999  # a sequence's scaled acceptance stays a probability


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


@dataclass(slots=True)
class AdaptiveK:
    """Chooses k in [k_min, k_max] from measured acceptance by position and measured step costs."""

    k_max: int
    k_min: int = 1
    passed: list[float] = field(default_factory=list)  # decayed count of drafts accepted at position i
    tried: list[float] = field(default_factory=list)  # decayed count of drafts judged at position i
    draft: BucketedCosts = field(default_factory=BucketedCosts)
    verify: BucketedCosts = field(default_factory=BucketedCosts)
    by_seq: dict[int, list[float]] = field(default_factory=dict)  # running sequence -> [passed, tried]

    def __post_init__(self) -> None:
        if not 1 <= self.k_min <= self.k_max:
            raise ValueError(f"need 1 <= k_min <= k_max, got {self.k_min}..{self.k_max}")
        self.resize(self.k_max)

    def resize(self, k_max: int, k_min: int = 1) -> None:
        """New bounds (a policy change); what was learnt about positions that remain is kept."""
        self.k_max = k_max
        self.k_min = min(k_min, k_max)
        grow = k_max - len(self.passed)
        if grow > 0:
            self.passed += [0.0] * grow
            self.tried += [0.0] * grow

    def observe_verdicts(self, drafted: int, accepted: Sequence[int], seq_ids: Sequence[int] = ()) -> None:
        """One verify step: each sequence carried `drafted` drafts and accepted the given number
        (`seq_ids`, when given, name them in the same order)."""
        if drafted <= 0:
            return
        for seq_id, n in zip(seq_ids, accepted, strict=False):
            own = self.by_seq.get(seq_id)  # a sequence retired since has no entry, and gets none
            if own is not None:
                own[0] += n
                own[1] += min(n + 1, drafted)
        for n in accepted:
            for i in range(len(self.tried)):
                self.passed[i] *= DECAY
                self.tried[i] *= DECAY
            for i in range(min(n + 1, drafted, len(self.tried))):
                self.tried[i] += 1.0
                self.passed[i] += 1.0 if i < n else 0.0

    def track(self, seq_ids: Sequence[int]) -> None:
        for seq_id in seq_ids:
            self.by_seq.setdefault(seq_id, [0.0, 0.0])

    def forget(self, seq_ids: Sequence[int]) -> None:
        for seq_id in seq_ids:
            self.by_seq.pop(seq_id, None)

    def pooled(self) -> float:
        return (sum(self.passed) + 2 * PRIOR_P) / (sum(self.tried) + 2)

    def acceptance(self) -> list[float]:
        """p[i] for positions 1..k_max, each shrunk towards the acceptance pooled over all positions
        (deep positions are judged only when every earlier draft passed, so they see few tries)."""
        pooled = self.pooled()
        return [(p + pooled * PRIOR_TRIES) / (t + PRIOR_TRIES) for p, t in zip(self.passed, self.tried, strict=True)]

    def expected_tokens(self, k: int) -> float:
        return self.expected_by_k(self.acceptance(), 1.0)[k]

    def seq_scale(self, seq_id: int, pooled: float) -> float:
        """The sequence's acceptance over the pooled one (1 for a sequence not judged yet)."""
        passed, tried = self.by_seq.get(seq_id, (0.0, 0.0))
        return (passed + pooled * SEQ_PRIOR_TRIES) / (tried + SEQ_PRIOR_TRIES) / pooled

    def expected_by_k(self, acceptance: list[float], scale: float) -> list[float]:
        """E(0..k_max) for a sequence whose acceptance is `scale` times the pooled one."""
        out, total, reach = [1.0], 1.0, 1.0
        for p in acceptance:
            reach *= min(p * scale, P_CAP)
            total += reach
            out.append(total)
        return out

    def step_ms(self, k: int, overlapped: bool, batch: int = 0) -> float | None:
        d = self.draft.estimate(k, grows_with_k=True, batch=batch)
        v = self.verify.estimate(k, grows_with_k=False, batch=batch)
        if d is None or v is None:
            return None
        return max(d, v) if overlapped else d + v

    def choose(self, overlapped: bool = True, batch: int = 0) -> int:
        """The k with the most expected tokens per ms for a batch of this size; k_max until both costs
        were measured."""
        best_k, best_rate = self.k_max, -1.0
        expected = self.expected_by_k(self.acceptance(), 1.0)
        for k in range(self.k_min, self.k_max + 1):
            ms = self.step_ms(k, overlapped, batch)
            if ms is None:
                return self.k_max
            rate = expected[k] / max(ms, 1e-6)
            if rate > best_rate * (1 + 1e-9):
                best_k, best_rate = k, rate
        return best_k

    def choose_to_finish(self, to_go: Mapping[int, int], overlapped: bool = True) -> int:
        """The k whose batch is expected to end soonest, T(k) above; `to_go`: each running sequence's
        tokens still to go (its max_tokens less its output: an end of sequence can only come sooner)."""
        live = {seq_id: r for seq_id, r in to_go.items() if r > 0}
        if not live:
            return self.choose(overlapped, len(to_go))
        running = [size_bucket(len(live) - j) for j in range(len(live))]  # sequences running in segment j
        ks = range(self.k_min, self.k_max + 1)
        costs = {k: {b: self.step_ms(k, overlapped, b) for b in set(running)} for k in ks}
        if any(ms is None for by_bucket in costs.values() for ms in by_bucket.values()):
            return self.k_max
        acceptance, pooled = self.acceptance(), self.pooled()
        by_scale: dict[float, list[float]] = {}  # sequences of about the same acceptance share one E(k)
        expected = []
        for seq_id, r in live.items():
            scale = round(self.seq_scale(seq_id, pooled), 3)
            if scale not in by_scale:
                by_scale[scale] = self.expected_by_k(acceptance, scale)
            expected.append((r, by_scale[scale]))
        best_k, best_ms = self.k_max, float("inf")
        for k, by_bucket in costs.items():
            ends = sorted(r / e[k] for r, e in expected)
            total = sum((end - before) * by_bucket[b]  # type: ignore[operator]
                        for end, before, b in zip(ends, [0.0, *ends], running, strict=False))
            if total < best_ms * (1 - 1e-9):
                best_k, best_ms = k, total
        return best_k
