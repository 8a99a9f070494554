"""The two batches of batch-parallel speculative decoding, as pure bookkeeping.

Batch b drafts on steps with parity b and is verified on the next step, while the other
batch does the opposite. A sequence joins (or moves) only when its next action is a
draft, so the draft and verify halves of every plan stay consistent: every sequence in a
verify batch drafted in the step before. With one batch empty the same loop is standard
(sequential) SD; without a draft model every sequence is verified every step (AR).

A verifier that drafts on its own GPU (colocated) runs a plan's verify before its draft, so its
sequential SD is *fused*: one plan per cycle verifies every sequence that drafted in the plan
before and then drafts every sequence again. Alternating draft-only and verify plans instead left
each verify plan one control round trip behind a short draft step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CONTEXT_SCALE = 512.0  # context tokens that cost about as much as one extra sequence


@dataclass(slots=True)
class SeqSched:
    seq_id: int
    batch: int
    context: int
    tokens_to_go: int
    next_is_draft: bool = True

    @property
    def step_cost(self) -> float:
        """Relative cost of this sequence in a draft or verify step."""
        return 1.0 + self.context / CONTEXT_SCALE


@dataclass(slots=True)
class StepBatches:
    draft: list[int] = field(default_factory=list)
    verify: list[int] = field(default_factory=list)


class TwoBatchScheduler:
    """Assigns sequences to batch 0 or 1, balances them by load and plans each step."""

    def __init__(self, two_batches: bool, rebalance_threshold: float = 0.0) -> None:
        self.two_batches = two_batches
        self.rebalance_threshold = rebalance_threshold  # load gap (in step-cost units) tolerated without moves
        self.seqs: dict[int, SeqSched] = {}
        self.fuse_sd = False  # one batch: verify, then draft, in every plan (a colocated verifier)

    @property
    def fused(self) -> bool:
        """Plans now verify and draft the same batch."""
        return self.fuse_sd and not self.two_batches

    def load(self, batch: int) -> float:
        return sum(s.step_cost for s in self.seqs.values() if s.batch == batch)

    def members(self, batch: int) -> list[SeqSched]:
        return [s for s in self.seqs.values() if s.batch == batch]

    def add(self, seq_id: int, context: int, tokens_to_go: int) -> int:
        """New sequences go to the lighter batch (by step cost, then by tokens still to go)."""
        batch = 0
        if self.two_batches:
            keys = [(round(self.load(b), 6), self._tokens_to_go(b)) for b in (0, 1)]
            batch = 0 if keys[0] <= keys[1] else 1
        self.seqs[seq_id] = SeqSched(seq_id, batch, context, tokens_to_go)
        return batch

    def _tokens_to_go(self, batch: int) -> int:
        return sum(s.tokens_to_go for s in self.seqs.values() if s.batch == batch)

    def to_go(self, seq_id: int) -> int | None:
        """Tokens the sequence may still produce (None: not scheduled)."""
        seq = self.seqs.get(seq_id)
        return None if seq is None else seq.tokens_to_go

    def remove(self, seq_id: int) -> None:
        self.seqs.pop(seq_id, None)

    def progress(self, seq_id: int, new_tokens: int) -> None:
        seq = self.seqs.get(seq_id)
        if seq is not None:
            seq.context += new_tokens
            seq.tokens_to_go = max(0, seq.tokens_to_go - new_tokens)

    def use_two_batches(self, two_batches: bool) -> None:
        """Switch between psd (two batches) and one batch; call only with no step in flight.
        One batch means every sequence in batch 0; two batches fill up by rebalancing."""
        self.two_batches = two_batches
        if not two_batches:
            for seq in self.seqs.values():
                seq.batch = 0

    def restart_drafting(self) -> None:
        """After AR fallback every sequence starts again from a draft step."""
        for seq in self.seqs.values():
            seq.next_is_draft = True

    def rebalance(self) -> list[int]:
        """Move sequences waiting to draft from the heavier batch while that narrows the gap and
        the gap exceeds `rebalance_threshold` (0: whenever a move narrows it)."""
        if not self.two_batches:
            return []
        moved: list[int] = []
        while True:
            loads = (self.load(0), self.load(1))
            heavy = 0 if loads[0] > loads[1] else 1
            gap = abs(loads[0] - loads[1])
            members = self.members(heavy)
            if len(members) <= 1 or gap <= self.rebalance_threshold:
                return moved
            # Moving cost c changes the gap to |gap - 2c|: worth it only when c < gap.
            candidates = [s for s in members if s.next_is_draft and s.step_cost < gap]
            if not candidates:
                return moved
            best = min(candidates, key=lambda s: abs(gap - 2 * s.step_cost))
            best.batch = 1 - heavy
            moved.append(best.seq_id)

    def plan(self, step: int, with_drafts: bool) -> StepBatches:
        """Which sequences draft and which are verified at this step."""
        if not with_drafts:
            for seq in self.seqs.values():
                seq.next_is_draft = True
            return StepBatches(verify=sorted(self.seqs))
        if self.fused:
            return self._plan_fused()
        drafting = step % 2
        out = StepBatches()
        for seq in sorted(self.seqs.values(), key=lambda s: s.seq_id):
            if seq.batch == drafting and seq.next_is_draft:
                out.draft.append(seq.seq_id)
                seq.next_is_draft = False
            elif seq.batch != drafting and not seq.next_is_draft:
                out.verify.append(seq.seq_id)
                seq.next_is_draft = True
        return out

    def _plan_fused(self) -> StepBatches:
        out = StepBatches()
        for seq in sorted(self.seqs.values(), key=lambda s: s.seq_id):
            if not seq.next_is_draft:
                out.verify.append(seq.seq_id)
            out.draft.append(seq.seq_id)
            seq.next_is_draft = False
        return out

    def batch_sizes(self) -> tuple[int, int]:
        return len(self.members(0)), len(self.members(1))
