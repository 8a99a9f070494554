"""Standard SD on the verifier's own GPU: the draft model loaded beside the target (`--colocated-draft`).

The paper's baseline, a deployment for users without a spare GPU. The batch manager drives it
as it drives a draft service (a plan's draft batch drafts, the next plan verifies it), but the
drafts stay in this process: no data plane, no draft service. After each verify the verdict is
committed to the draft model's KV here, as the draft service commits the verdicts it receives.
A plan's verify runs before its draft, so in sequential SD the manager sends one plan per cycle
that verifies a batch and drafts it again (scheduler.py, "fused").

A TETRIS plan (a draft budget) selects on the device, as the in-process engine does
(engine/tetris_capacity.py): the capacity is set from the last step's count before drafting, so the
verify is queued behind the draft without reading the per-row counts back; they come back with the
verdict (`verified_lengths`). Tensor-parallel followers lay a packed verify out from host lengths, so
with them the selection is read back as in PSD.
"""

from __future__ import annotations

from minedraft.engine.draft_ahead import settle
from minedraft.engine.drafter import Drafter, Proposal
from minedraft.engine.hidden_rows import HiddenRows
from minedraft.engine.rejection import Verdict
from minedraft.engine.tetris_capacity import DraftCapacity, row_tile
from minedraft.engine.tetris_propose import propose_selected
from minedraft.proto import control_pb2
from minedraft.verifier.colocated_ahead import draft_ahead
from minedraft.worker.data_frames import DraftPayload
from minedraft.worker.membership import apply_membership, forget_all


class ColocatedDrafter:
    """A Drafter on the verifier's device plus the one proposal waiting for its verify step."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.pending: DraftPayload | None = None
        self.ahead: tuple[int, list[int], int] | None = None  # (step, ids, k) drafted ahead: colocated_ahead.py
        self.capacity: DraftCapacity | None = None  # TETRIS selects on the device (select_on_device)

    def select_on_device(self, packed: bool) -> None:
        """Keep TETRIS's selections on the device, sized to the row tile of this device's verify (and to the
        verifier's packed graphs, `packed`)."""
        self.capacity = DraftCapacity(row_tile(str(self.drafter.runner.device)), packed)

    def reset(self) -> None:
        forget_all(self.drafter)
        self.pending, self.ahead = None, None
        if self.capacity is not None:  # nothing measured for the next manager's batches yet
            self.capacity = DraftCapacity(self.capacity.tile, self.capacity.grained)

    def apply_membership(self, plan: control_pb2.StepPlan) -> None:
        apply_membership(self.drafter, plan)

    def take(self) -> DraftPayload | None:
        """The drafts of the previous plan's draft batch (None when it drafted nothing)."""
        payload, self.pending = self.pending, None
        return payload

    def commit(self, seq_ids: list[int], rows: list[list[int]], accepted: list[int],
               hidden: HiddenRows | None = None) -> None:
        """The verifier's tokens for every verified sequence (AR steps too: the copies stay complete), and for
        an EAGLE head the target's states (engine/hidden_rows.py), already on this device."""
        if self.ahead is not None and self.ahead[1] == seq_ids:  # drafted ahead: settle what it left open
            settle(self.drafter, seq_ids, rows, accepted, self.ahead[2])
            return
        parts = hidden.split() if hidden is not None else [None] * len(seq_ids)
        for seq_id, row, n, part in zip(seq_ids, rows, accepted, parts, strict=True):
            if seq_id in self.drafter.seqs:
                self.drafter.commit(seq_id, row[: n + 1], n, part)

    def draft_ahead(self, plan: control_pb2.StepPlan, ids: list[int], proposal: Proposal | None,
                    verdict: Verdict) -> None:
        """Queue the plan's drafts behind its verify, before the verdict is read (colocated_ahead.py's plain
        case); `commit` then settles the drafter and `draft` has nothing left to do."""
        payload = draft_ahead(self.drafter, plan, ids, proposal, verdict)
        if payload is not None:
            self.pending, self.ahead = payload, (plan.step, ids, plan.k)

    def draft(self, plan: control_pb2.StepPlan) -> None:
        """Propose k tokens for the plan's draft batch; the next plan verifies them."""
        if self.ahead is not None and self.ahead[0] == plan.step:
            self.ahead = None  # its drafts are queued already
            return
        ids = list(plan.draft_batch)
        budget, capacity = plan.draft_budget, None
        if self.capacity is not None:
            budget, capacity = self.capacity.plan(len(ids), plan.k, budget)
        proposal = propose_selected(self.drafter, ids, plan.k, budget, plan.draft_min_prob, capacity)
        self.pending = DraftPayload(plan.step, ids, proposal.tokens, proposal.probs, proposal.lengths,
                                    proposal.counts, proposal.wanted, proposal.capacity)


def verified_lengths(proposal: Proposal | None, colocated: ColocatedDrafter | None) -> list[int] | None:
    """The drafts each row of a verified proposal had (None: all k), once its verdict is read: a selection made on
    the colocated draft's device reads its counts back now and sets the next step's capacity."""
    if proposal is None:
        return None
    if colocated is not None and colocated.capacity is not None:
        colocated.capacity.settle(proposal)
    return proposal.lengths
