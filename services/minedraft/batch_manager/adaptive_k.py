"""Adaptive k for `auto` mode: each plan drafts the k expected to pay best.

Two measurements drive it, both from what the workers already report:
- acceptance by position: p[i] = P(draft i+1 is accepted | drafts 1..i were), counted from every
  verdict (a sequence that accepted n of k drafts tried positions 1..min(n+1, k) and passed the
  first n; under TETRIS k is the row's own verified length), with old evidence decaying so the
  estimate follows the traffic; and each running sequence's own acceptance, since sequences
  differ (its p[i] is the pooled one scaled by its ratio);
- step costs: the draft service's and the verifier's compute time per step (step_costs.py: a
  draft's by k and batch size, a verify's by the tokens it checks, b(k + 1)).
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
A draft cost of a k not yet measured comes from a line through the measured k (one measured: draft
~ k), a verify cost from the measured token counts around it (above them: the last slope; one
measured: flat). Such guesses could hold auto at a k for good: with only k_max measured, a verify-
bound PSD step looks as dear at every k (on two H200s auto kept k = 6 where k = 4 was 7% faster).
So once the chosen k is measured, a neighbour whose costs are still guessed, and whose guess is
within PROBE_WITHIN of the choice, is drafted instead, and the search walks on from what it
measured (a few plans per batch size). Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from minedraft.batch_manager.step_costs import BucketedCosts, TokenCosts, near_size

DECAY = 0.995  # per verified sequence: evidence ~200 sequences old counts e^-1 as much
PRIOR_TRIES = 8.0  # pseudo-counts pulling a sparsely seen position towards the pooled acceptance
PRIOR_P = 0.8  # optimistic start (2 pseudo-counts in the pool), so unseen positions get tried
SEQ_PRIOR_TRIES = 8.0  # pseudo-counts pulling a young sequence's acceptance towards the pooled one
P_CAP = 0.999  # a sequence's scaled acceptance stays a probability
PROBE_WITHIN = 0.10  # a neighbour of the best k, costs unmeasured, is tried when its guess is this close


@dataclass(slots=True)
class AdaptiveK:
    """Chooses k in [k_min, k_max] from measured acceptance by position and measured step costs."""

    k_max: int
    k_min: int = 1
    passed: list[float] = field(default_factory=list)  # decayed count of drafts accepted at position i
    tried: list[float] = field(default_factory=list)  # decayed count of drafts judged at position i
    draft: BucketedCosts = field(default_factory=BucketedCosts)
    verify: TokenCosts = field(default_factory=TokenCosts)
    by_seq: dict[int, list[float]] = field(default_factory=dict)  # running sequence -> [passed, tried]
    scores: dict[int, float] = field(default_factory=dict)  # the last choice's score by k (lower: better)

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

    def observe_verdicts(self, drafted: int, accepted: Sequence[int], seq_ids: Sequence[int] = (),
                         lengths: Sequence[int] | None = None) -> None:
        """One verify step: each sequence carried `drafted` drafts and accepted the given number
        (`seq_ids`, when given, name them in the same order). `lengths` (TETRIS: each row verified its own
        number of drafts, 0..k + extra) replace `drafted` row by row: a row of length L was judged at positions
        1..min(n + 1, L) only, and accepting all L stops there; a row of length 0 judged none, and counts nothing."""
        if drafted <= 0:
            return
        rows = [drafted] * len(accepted) if lengths is None else lengths
        for seq_id, n, length in zip(seq_ids, accepted, rows, strict=False):
            own = self.by_seq.get(seq_id)  # a sequence retired since has no entry, and gets none
            if own is not None:
                own[0] += n
                own[1] += min(n + 1, length)
        for n, length in zip(accepted, rows, strict=True):
            if length <= 0:
                continue
            for i in range(len(self.tried)):
                self.passed[i] *= DECAY
                self.tried[i] *= DECAY
            for i in range(min(n + 1, length, len(self.tried))):
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
        v = self.verify.estimate(k, batch)
        if d is None or v is None:
            return None
        return max(d, v) if overlapped else d + v

    def measured(self, k: int, batch: int = 0) -> bool:
        """Both of k's costs come from steps at k (in the bucket a batch of this size reads), not a guess."""
        draft = self.draft.table(batch)
        return draft is not None and k in draft.by_k and self.verify.measured(k, batch)

    def best(self) -> int | None:
        """The last choice's best-scoring k (the smaller on a tie; None: it had no costs to score by). It returned
        another only to measure it."""
        return min(self.scores, key=lambda k: (self.scores[k], k)) if self.scores else None

    def pick(self, scores: dict[int, float], batch: int) -> int:
        """The best-scoring k (`scores`: lower is better), or, once it is measured, its neighbour to measure:
        unmeasured, and guessed within PROBE_WITHIN of it. The scores are kept (`best`, the DEBUG line)."""
        self.scores = scores
        best_k = self.best()
        assert best_k is not None
        if not self.measured(best_k, batch):
            return best_k
        near = [(scores[k], k) for k in (best_k - 1, best_k + 1)
                if self.k_min <= k <= self.k_max and not self.measured(k, batch)
                and scores[k] <= scores[best_k] * (1 + PROBE_WITHIN)]
        return min(near)[1] if near else best_k

    def choose(self, overlapped: bool = True, batch: int = 0) -> int:
        """The k with the most expected tokens per ms for a batch of this size (or a neighbour to
        measure); k_max until both costs were measured."""
        expected = self.expected_by_k(self.acceptance(), 1.0)
        ms_per_token: dict[int, float] = {}
        self.scores = {}
        for k in range(self.k_min, self.k_max + 1):
            ms = self.step_ms(k, overlapped, batch)
            if ms is None:
                return self.k_max
            ms_per_token[k] = ms / expected[k]
        return self.pick(ms_per_token, batch)

    def choose_to_finish(self, to_go: Mapping[int, int], overlapped: bool = True) -> int:
        """The k whose batch is expected to end soonest, T(k) above; `to_go`: each running sequence's
        tokens still to go (its max_tokens less its output: an end of sequence can only come sooner)."""
        live = {seq_id: r for seq_id, r in to_go.items() if r > 0}
        if not live:
            return self.choose(overlapped, len(to_go))
        running = [near_size(len(live) - j) for j in range(len(live))]  # sequences running in segment j
        ks = range(self.k_min, self.k_max + 1)
        costs = {k: {b: self.step_ms(k, overlapped, b) for b in set(running)} for k in ks}
        self.scores = {}
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
        to_end: dict[int, float] = {}
        for k, by_bucket in costs.items():
            ends = sorted(r / e[k] for r, e in expected)
            to_end[k] = sum((end - before) * by_bucket[b]  # type: ignore[operator]
                            for end, before, b in zip(ends, [0.0, *ends], running, strict=False))
        return self.pick(to_end, len(live))
