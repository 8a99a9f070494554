"""Adaptive k for `auto` mode: each plan drafts the k that maximises expected tokens per unit time.

Two measurements drive it, both from what the workers already report:
- per-position acceptance: p[i] = P(draft i+1 is accepted | drafts 1..i were), counted from
  every verdict (a sequence that accepted n of k drafts tried positions 1..min(n+1, k) and
  passed the first n), with old evidence decaying so the estimate follows the traffic;
- step costs: the draft service's and the verifier's compute time per step, kept per k.
Expected tokens per sequence per verify with k drafts is 1 + sum_{i<=k} prod_{j<=i} p[j]; in
PSD a step costs max(draft(k), verify(k)) (the two batches overlap), in SD their sum. Costs of
a k not yet measured come from a line through the measured ones (draft time grows with k, the
k sequential draft forwards; verify time barely moves), or, with one measured k only, from
draft ~ k and verify flat. Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minedraft.proto.control_pb2 import SeqSpec

DECAY = 0.995  # per verified sequence: evidence ~200 sequences old counts e^-1 as much
PRIOR_TRIES = 8.0  # pseudo-counts pulling a sparsely seen position towards the pooled acceptance
PRIOR_P = 0.8  # optimistic start (2 pseudo-counts in the pool), so unseen positions get tried
COST_EMA = 0.2


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

    def observe_verdicts(self, drafted: int, accepted: list[int]) -> None:
        """One verify step: each sequence carried `drafted` drafts and accepted the given number."""
        if drafted <= 0:
            return
        for n in accepted:
            for i in range(len(self.tried)):
                self.passed[i] *= DECAY
                self.tried[i] *= DECAY
            for i in range(min(n + 1, drafted, len(self.tried))):
                self.tried[i] += 1.0
                self.passed[i] += 1.0 if i < n else 0.0

    def acceptance(self) -> list[float]:
        """p[i] for positions 1..k_max, each shrunk towards the acceptance pooled over all positions
        (deep positions are judged only when every earlier draft passed, so they see few tries)."""
        pooled = (sum(self.passed) + 2 * PRIOR_P) / (sum(self.tried) + 2)
        return [(p + pooled * PRIOR_TRIES) / (t + PRIOR_TRIES) for p, t in zip(self.passed, self.tried, strict=True)]

    def expected_tokens(self, k: int) -> float:
        total, reach = 1.0, 1.0
        for p in self.acceptance()[:k]:
            reach *= p
            total += reach
        return total

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
        for k in range(self.k_min, self.k_max + 1):
            ms = self.step_ms(k, overlapped, batch)
            if ms is None:
                return self.k_max
            rate = self.expected_tokens(k) / max(ms, 1e-6)
            if rate > best_rate * (1 + 1e-9):
                best_k, best_rate = k, rate
        return best_k


def costs_view(costs: BucketedCosts) -> dict[int, dict[int, float]]:
    return {b: {k: round(ms, 3) for k, ms in sorted(t.by_k.items())} for b, t in sorted(costs.buckets.items())}


class PlanK:
    """The step loop's hook: the k each plan drafts (the policy's k; in auto, the adaptive choice in
    1..k) and, from the workers' events, what the adaptive estimate learns.

    A step whose verify (or draft) batch holds a sequence on its first verify (draft) also computes
    that sequence's prompt: its time says nothing about k, so it teaches acceptance but not costs.
    Without this, the prefill at the start of every burst of requests inflates the EMA of the k in
    use and auto wanders off the best k for the next ten or so steps. A step that captured a CUDA
    graph (a shape met for the first time, tens of ms on a GPU) is left out of the costs alike.

    Fused SD (a colocated verifier: one plan verifies the drafts of the plan before, then drafts k
    more) reports one host time for both halves. The draft's GPU work is queued, not waited for, so
    that time holds the previous plan's draft and this plan's verify of those drafts: a whole cycle
    of the k they carried. It is kept as that k's "draft" cost (it grows with k) beside a zero verify
    cost, so the choice weighs the whole cycle (max and sum of the two halves are then the same)."""

    def __init__(self, fused: Callable[[], bool] = lambda: False) -> None:
        self.fused = fused  # plans now verify and draft one batch (scheduler.py)
        self.adaptive: AdaptiveK | None = None
        self.by_step: dict[int, int] = {}  # k drafted at each recent step (0: no drafts)
        self.unverified: set[int] = set()  # sequences whose prompt the verifier has not computed yet
        self.undrafted: set[int] = set()  # ... the draft service has not
        self.cold: dict[int, tuple[bool, bool]] = {}  # step -> (its verify, its draft) included a prompt
        self.chosen: dict[int, int] = {}  # auto: how many plans drafted each k

    def for_plan(self, step: int, mode: str, k: int, with_drafts: bool, draft_batch: Sequence[int] = (),
                 verify_batch: Sequence[int] = (), added: Sequence[SeqSpec] = (),
                 redrafted: Sequence[SeqSpec] = (), removed: Sequence[int] = (), k_min: int = 1) -> int:
        """`added`: new sequences (both workers); `redrafted`: re-sent to a recovered draft service;
        auto chooses within k_min..k."""
        self.unverified.update(spec.seq_id for spec in added)
        self.undrafted.update(spec.seq_id for spec in (*added, *redrafted))
        self.unverified.difference_update(removed)
        self.undrafted.difference_update(removed)
        cold_verify = not self.unverified.isdisjoint(verify_batch)
        cold_draft = with_drafts and not self.undrafted.isdisjoint(draft_batch)
        self.unverified.difference_update(verify_batch)
        if with_drafts:
            self.undrafted.difference_update(draft_batch)
        self.cold[step] = (cold_verify, cold_draft)
        self.cold.pop(step - 16, None)
        chosen = k
        # Every drafting mode teaches the estimate (acceptance by position, the cost of the k in use), so a
        # policy change to auto starts from what the deployment has already measured.
        if self.adaptive is None and (with_drafts or mode == "auto"):
            self.adaptive = AdaptiveK(k_max=k, k_min=min(k_min, k))
        elif self.adaptive is not None and with_drafts and k > self.adaptive.k_max:
            self.adaptive.resize(k, self.adaptive.k_min)  # a fixed k beyond auto's last bounds: its positions too
        if mode == "auto":
            assert self.adaptive is not None
            if (self.adaptive.k_max, self.adaptive.k_min) != (k, min(k_min, k)):
                self.adaptive.resize(k, k_min)
            chosen = self.adaptive.choose(overlapped=True, batch=len(draft_batch))
            if with_drafts:
                self.chosen[chosen] = self.chosen.get(chosen, 0) + 1
        self.by_step[step] = chosen if with_drafts else 0
        self.by_step.pop(step - 16, None)
        return chosen

    def snapshot(self) -> dict[str, object] | None:
        """What adaptive k has learnt (in any drafting mode) and, in auto, chosen (None before anything was
        drafted): for /health and for tuning k_min..k."""
        a = self.adaptive
        if a is None:
            return None
        return {"k_min": a.k_min, "k_max": a.k_max, "plans_by_k": dict(sorted(self.chosen.items())),
                "acceptance_by_position": [round(p, 4) for p in a.acceptance()],
                "draft_ms_by_batch_and_k": costs_view(a.draft), "verify_ms_by_batch_and_k": costs_view(a.verify)}

    def judged(self, step: int) -> int:
        """Drafts each sequence verified at `step` carries: its batch drafted in the step before."""
        return self.by_step.get(step - 1, 0)

    def on_verify(self, step: int, drafted: int, accepted: list[int], compute_ms: float | None) -> None:
        """`compute_ms`: None when the step's time says nothing of its k (it captured a CUDA graph)."""
        if self.adaptive is not None and drafted > 0 and accepted:
            self.adaptive.observe_verdicts(drafted, accepted)
            if compute_ms is None:
                return
            if self.fused():
                cold = self.cold.get(step, (False, False))[0] or self.cold.get(step - 1, (False, False))[1]
                if not cold:
                    self.adaptive.draft.add(drafted, compute_ms, len(accepted))
                    self.adaptive.verify.add(drafted, 0.0, len(accepted))
            elif not self.cold.get(step, (False, False))[0]:
                self.adaptive.verify.add(drafted, compute_ms, len(accepted))

    def on_draft(self, step: int, compute_ms: float | None, batch: int = 0) -> None:
        k = self.by_step.get(step, 0)
        if self.adaptive is not None and k > 0 and compute_ms and not self.cold.get(step, (False, False))[1]:
            self.adaptive.draft.add(k, compute_ms, batch)
