"""SD colocated: the next drafts queued behind the verify, before its verdict is read back.

A fused plan verifies a batch and drafts it again on the verifier's own draft model. On the ordinary
path the host waits for the verdict, commits it to both models, and only then builds and queues the
draft's k forwards, so the GPU idles through the readback, both commits and the draft's preparation.
The draft's inputs are gathers over the verdict on the device (engine/draft_ahead.py, as the draft
service does in PSD), so its forwards are queued right behind the verify; the host reads the verdict
back while the GPU drafts, and the drafter's bookkeeping is settled at the commit to exactly what
`Drafter.commit` then `Drafter.propose` would have left (tests/test_draft_ahead.py checks that).

Only the plain case: a model drafter (not an EAGLE head), drafts that came from the same model for the
same batch in the same order (one width kd for every row, none ragged), no grammar rows (their masks need
each draft on the host), and room for the worst case; anything else drafts after the commit as before.
"""

from __future__ import annotations

from minedraft.engine.draft_ahead import awaited_k, propose_ahead, room_to_draft_ahead
from minedraft.engine.drafter import Drafter, Proposal
from minedraft.engine.rejection import Verdict
from minedraft.proto import control_pb2
from minedraft.worker.data_frames import DraftPayload


def draft_ahead(drafter: Drafter, plan: control_pb2.StepPlan, ids: list[int], proposal: Proposal | None,
                verdict: Verdict) -> DraftPayload | None:
    """The plan's drafts queued from `verdict` (still on the device) when the plain case holds, else None."""
    if type(drafter) is not Drafter or proposal is None:
        return None
    if getattr(proposal, "lengths", None) is not None or getattr(proposal, "counts", None) is not None:  # ragged
        return None
    if getattr(plan, "draft_budget", 0) > 0:  # TETRIS scores and selects its drafts: not this path
        return None
    if not plan.with_drafts or plan.k < 1 or list(plan.draft_batch) != ids or drafter.grammars.rows(ids):
        return None
    kd = proposal.tokens.shape[1]
    if kd < 1 or any(s not in drafter.seqs or awaited_k(drafter, s) != kd for s in ids):
        return None
    if not room_to_draft_ahead(drafter, ids, kd, plan.k):
        return None
    drafts = propose_ahead(drafter, ids, kd, plan.k, verdict.accepted, verdict.tokens)
    return DraftPayload(plan.step, ids, drafts.tokens, drafts.probs)
