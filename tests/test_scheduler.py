"""Two-batch bookkeeping: consistent plans, load balancing, rebalancing after skew."""

from __future__ import annotations

import pytest

from minedraft.batch_manager.scheduler import TwoBatchScheduler


def run_steps(sched: TwoBatchScheduler, first: int, count: int, drafted: dict[int, int]) -> None:
    """Plan steps and check the invariant: everything verified at t drafted at t-1."""
    for step in range(first, first + count):
        plan = sched.plan(step, with_drafts=True)
        assert not set(plan.draft) & set(plan.verify)
        for seq in plan.verify:
            assert drafted.get(seq) == step - 1, f"seq {seq} verified at {step} without drafting at {step - 1}"
        for seq in plan.draft:
            drafted[seq] = step


def test_new_sequences_alternate_between_batches_and_steps_alternate_roles() -> None:
    sched = TwoBatchScheduler(two_batches=True)
    for i in range(4):
        sched.add(i, context=10, tokens_to_go=50)
    assert sched.batch_sizes() == (2, 2)
    plans = [sched.plan(step, True) for step in range(4)]
    assert plans[0].draft == [0, 2] and plans[0].verify == []
    assert plans[1].draft == [1, 3] and plans[1].verify == [0, 2]
    assert plans[2].draft == [0, 2] and plans[2].verify == [1, 3]
    assert plans[3].draft == [1, 3] and plans[3].verify == [0, 2]


def test_balance_is_by_load_not_count() -> None:
    sched = TwoBatchScheduler(two_batches=True)
    sched.add(0, context=2048, tokens_to_go=10)  # one long-context sequence weighs like five short ones
    assert [sched.add(i, context=16, tokens_to_go=10) for i in range(1, 5)] == [1, 1, 1, 1]
    assert sched.batch_sizes() == (1, 4)


def test_finishes_that_skew_the_batches_are_rebalanced_without_breaking_plans() -> None:
    sched = TwoBatchScheduler(two_batches=True)
    for i in range(8):
        sched.add(i, context=32, tokens_to_go=100)
    drafted: dict[int, int] = {}
    run_steps(sched, 0, 3, drafted)
    for seq in (0, 2, 4, 6):  # all of batch 0 finishes
        sched.remove(seq)
    assert sched.batch_sizes() == (0, 4)
    moved: list[int] = []
    for step in range(3, 9):
        moved += sched.rebalance()
        run_steps(sched, step, 1, drafted)
    assert sched.batch_sizes() == (2, 2)
    assert len(moved) == 2


def test_single_batch_mode_is_sequential_sd() -> None:
    sched = TwoBatchScheduler(two_batches=False)
    for i in range(3):
        sched.add(i, context=8, tokens_to_go=10)
    assert sched.rebalance() == []
    plans = [sched.plan(step, True) for step in range(4)]
    assert [(p.draft, p.verify) for p in plans] == [([0, 1, 2], []), ([], [0, 1, 2])] * 2


def test_without_drafts_everything_is_verified_every_step_and_drafting_restarts_cleanly() -> None:
    sched = TwoBatchScheduler(two_batches=True)
    for i in range(4):
        sched.add(i, context=8, tokens_to_go=10)
    sched.plan(0, True)
    assert sched.plan(1, with_drafts=False).verify == [0, 1, 2, 3]
    drafted: dict[int, int] = {}
    run_steps(sched, 2, 4, drafted)



def skewed(threshold: float) -> TwoBatchScheduler:
    """Eight equal sequences, then all of batch 0 finishes: batch 1 holds a load of ~4.25, batch 0 none."""
    sched = TwoBatchScheduler(two_batches=True, rebalance_threshold=threshold)
    for i in range(8):
        sched.add(i, context=32, tokens_to_go=100)
    for seq in (0, 2, 4, 6):
        sched.remove(seq)
    return sched


@pytest.mark.parametrize(("threshold", "moved", "sizes"), [
    (0.0, [1, 3], (2, 2)),  # the default: move while a move narrows the gap, as rebalance always did
    (2.5, [1], (1, 3)),  # one move leaves a gap of ~2.1, within the threshold
    (4.5, [], (0, 4)),  # the whole gap is tolerated
])
def test_rebalancing_stops_once_the_load_gap_is_within_the_threshold(
    threshold: float, moved: list[int], sizes: tuple[int, int]
) -> None:
    sched = skewed(threshold)
    assert sched.rebalance() == moved and sched.batch_sizes() == sizes


def test_one_batch_mode_gathers_every_sequence_and_two_batch_mode_spreads_them_again() -> None:
    sched = skewed(0.0)
    sched.use_two_batches(False)
    assert sched.batch_sizes() == (4, 0) and sched.rebalance() == []
    sched.use_two_batches(True)
    assert sched.rebalance() == [1, 3] and sched.batch_sizes() == (2, 2)


def test_fused_sd_verifies_what_drafted_in_the_plan_before_then_drafts_everyone_again() -> None:
    """A colocated verifier's SD: one plan per cycle (verify, then draft, on one GPU)."""
    sched = TwoBatchScheduler(two_batches=False)
    sched.fuse_sd = True
    for i in range(2):
        sched.add(i, context=8, tokens_to_go=10)
    first, second = sched.plan(0, True), sched.plan(1, True)
    assert (first.draft, first.verify) == ([0, 1], [])  # nothing drafted yet
    assert (second.draft, second.verify) == ([0, 1], [0, 1])
    sched.add(2, context=8, tokens_to_go=10)  # joins with a draft, is verified from the next plan on
    sched.remove(0)
    third, fourth = sched.plan(2, True), sched.plan(3, True)
    assert (third.draft, third.verify) == ([1, 2], [1])
    assert (fourth.draft, fourth.verify) == ([1, 2], [1, 2])
    assert sched.plan(4, with_drafts=False).verify == [1, 2]  # AR: everyone, and drafting starts over
    assert (sched.plan(5, True).verify, sched.plan(6, True).verify) == ([], [1, 2])


def test_fusing_applies_to_one_batch_only() -> None:
    sched = TwoBatchScheduler(two_batches=True)
    sched.fuse_sd = True
    assert not sched.fused  # psd on a colocated verifier keeps its two batches
    for i in range(4):
        sched.add(i, context=8, tokens_to_go=10)
    run_steps(sched, 0, 6, {})
    sched.use_two_batches(False)
    assert sched.fused
