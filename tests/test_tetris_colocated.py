"""SD colocated with TETRIS plans through the verifier's own executor: the selection stays on the device.

The colocated drafter sets each step's capacity from the last verdict's count (engine/tetris_capacity.py), so
the verify gets the per-row counts as a device tensor and nothing is read back between the draft and the
verify; the counts come back with the verdict and go into the event as each row's drafts. Greedy output
equals AR's token for token, as with the selection read back on the host (the draft service's way, kept for
tensor-parallel followers)."""

from __future__ import annotations

import pytest

from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.engine.drafter import Drafter, Proposal
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier
from minedraft.proto import control_pb2
from minedraft.verifier.colocated import ColocatedDrafter
from minedraft.verifier.executor import VerifierExecutor
from tests.test_ar_launch_ahead import spec

BLOCK = 16
PROMPTS = {1: [5, 9, 3, 17, 22], 2: [7, 7, 8, 2, 40, 41], 3: [60, 61, 62], 4: [11, 30, 31, 32, 33, 34, 35, 36]}
K, EXTRA, STEPS = 2, 2, 18


def plans(drafting: bool, min_prob: float) -> list[control_pb2.StepPlan]:
    ids = sorted(PROMPTS)
    out = []
    for step in range(STEPS):
        adds = [spec(s, PROMPTS[s]) for s in ids] if step == 0 else []
        plan = control_pb2.StepPlan(step=step, verify_batch=ids, add=adds)
        if drafting:  # a fused TETRIS plan: verify the last drafts, draft k + extra again under a k x B budget
            plan.k, plan.with_drafts, plan.draft_here = K + EXTRA, True, True
            plan.draft_batch.extend(ids)
            plan.draft_budget, plan.draft_min_prob = K * len(ids), min_prob
        out.append(plan)
    return out


def run(drafting: bool, on_device: bool = True, min_prob: float = 0.0) -> tuple[dict[int, list[int]], list, list]:
    """Each sequence's tokens after the plans, the proposals the verifier judged, and each event's drafts."""
    worker = Verifier(ModelRunner(load_model(TINY_TARGET), 256, BLOCK))
    colocated = ColocatedDrafter(Drafter(ModelRunner(load_model(TINY_DRAFT), 256, BLOCK))) if drafting else None
    executor = VerifierExecutor(worker, None, "", 0, colocated=colocated)  # type: ignore[arg-type]
    if colocated is not None and not on_device:
        colocated.capacity = None  # read each selection back before the verify, as with followers
    judged: list[Proposal] = []
    judge = worker.judge

    def spy(seq_ids: list[int], proposal: Proposal | None) -> object:
        if proposal is not None:
            judged.append(Proposal(proposal.tokens.clone(), None, lengths=proposal.lengths, counts=proposal.counts,
                                   wanted=proposal.wanted, capacity=proposal.capacity))
        return judge(seq_ids, proposal)

    worker.judge = spy  # type: ignore[method-assign]
    drafted = [list(executor.handle_plan(plan).verdicts.drafted) for plan in plans(drafting, min_prob)]
    return {s: list(worker.seqs[s].tokens) for s in PROMPTS}, judged, drafted


@pytest.mark.skipif(not (TINY_TARGET / "config.json").exists(), reason="bundled pair not built")
@pytest.mark.parametrize("min_prob", [0.0, 0.3], ids=["budget", "floor"])
def test_a_colocated_tetris_selection_stays_on_the_device_and_equals_ar(min_prob: float) -> None:
    ar, _, _ = run(drafting=False)
    device, judged, drafted = run(drafting=True, min_prob=min_prob)
    host, host_judged, _ = run(drafting=True, on_device=False, min_prob=min_prob)
    for seq_id, tokens in device.items():
        assert len(tokens) > len(ar[seq_id]) // 2, "drafting made progress"
        n = min(len(tokens), len(ar[seq_id]), len(host[seq_id]))
        assert tokens[:n] == ar[seq_id][:n] == host[seq_id][:n]
    selected = [p for p in judged if p.counts is not None]
    assert selected, "the verifier judged device counts"
    assert all(p.lengths is None for p in judged), "no selection was read back before its verify"
    for p in selected:  # the tokens past each row's count are the pruned ones, and the capacity bounds them
        counts = p.counts.tolist()
        assert sum(counts) <= p.capacity <= K * len(PROMPTS)
        assert [sum(t >= 0 for t in row) for row in p.tokens.tolist()] == counts
    assert any(len(set(row)) > 1 for row in drafted if row), "rows verified to their own depths, reported"
    assert all(p.counts is None for p in host_judged) and any(p.lengths is not None for p in host_judged)
