"""Adaptive k learning from TETRIS steps: rows verify their own number of drafts (0..k + tetris_extra), and
acceptance by position counts only the positions a row verified. The verifier reports each row's count with the
verdict (Verdicts.drafted); the step driver hands them through PlanK to the estimate."""

from __future__ import annotations

from pathlib import Path

import pytest

from minedraft.batch_manager.adaptive_k import DECAY, AdaptiveK
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.plan_k import PlanK
from minedraft.proto import control_pb2
from tests.step_driver_support import Stack, word_tokenizer

K = 3  # the plan's k: a k-assuming count takes every row to have carried 3 drafts
LENGTHS = [0, 1, 2, 5, 3, 4, 2, 1, 5, 2]  # drafts each row verified (TETRIS, extra 2)
ACCEPTED = [0, 1, 2, 4, 3, 4, 0, 0, 5, 1]  # of them, accepted (n == length: all accepted, no rejection tried)


def hand_count(k_max: int, lengths: list[int], accepted: list[int]) -> tuple[list[float], list[float]]:
    """(passed, tried) by position, written out: row by row, old evidence decays once per row that verified a
    draft; a row of length L accepting n tried positions 0..min(n + 1, L) - 1 and passed the first n."""
    passed, tried = [0.0] * k_max, [0.0] * k_max
    for length, n in zip(lengths, accepted, strict=True):
        if length == 0:
            continue
        passed, tried = [p * DECAY for p in passed], [t * DECAY for t in tried]
        for i in range(min(n + 1, length, k_max)):
            tried[i] += 1.0
            passed[i] += float(i < n)
    return passed, tried


def test_ragged_verdicts_match_the_hand_count_and_not_a_k_count() -> None:
    est = AdaptiveK(k_max=5)
    est.observe_verdicts(K, ACCEPTED, lengths=LENGTHS)
    passed, tried = hand_count(5, LENGTHS, ACCEPTED)
    assert est.passed == pytest.approx(passed) and est.tried == pytest.approx(tried)
    ref = AdaptiveK(k_max=5)
    ref.passed, ref.tried = passed, tried
    assert est.acceptance() == pytest.approx(ref.acceptance())
    wrong = AdaptiveK(k_max=5)  # every row taken to carry k drafts
    wrong.observe_verdicts(K, ACCEPTED)
    assert wrong.tried != pytest.approx(tried)
    assert wrong.acceptance() != pytest.approx(est.acceptance())


def test_a_row_that_accepts_its_whole_length_tries_no_further() -> None:
    """Length 2, both accepted: positions 0..1 passed, position 2 never judged (a k = 4 count would call it a
    rejection there); its own acceptance counts 2 passed of 2 tried."""
    est = AdaptiveK(k_max=4)
    est.track([7])
    est.observe_verdicts(4, [2], [7], lengths=[2])
    assert est.tried == [1.0, 1.0, 0.0, 0.0] and est.passed == [1.0, 1.0, 0.0, 0.0]
    assert est.by_seq[7] == [2.0, 2.0]
    wrong = AdaptiveK(k_max=4)
    wrong.track([7])
    wrong.observe_verdicts(4, [2], [7])
    assert wrong.tried == [1.0, 1.0, 1.0, 0.0] and wrong.by_seq[7] == [2.0, 3.0]


def test_rows_of_length_zero_leave_the_estimate_as_it_was() -> None:
    est = AdaptiveK(k_max=3)
    est.observe_verdicts(K, [1, 2], lengths=[2, 3])
    before = (list(est.passed), list(est.tried))
    est.observe_verdicts(K, [0, 0], lengths=[0, 0])
    assert (est.passed, est.tried) == before


def test_plan_k_passes_the_lengths_on() -> None:
    plan = PlanK()
    plan.for_plan(0, "psd", K, True, draft_batch=[1, 2])
    plan.on_verify(1, K, ACCEPTED, None, range(len(ACCEPTED)), LENGTHS)
    assert plan.adaptive is not None
    passed, tried = hand_count(K, LENGTHS, ACCEPTED)  # the estimate's positions stop at its k_max (the policy k)
    assert plan.adaptive.tried == pytest.approx(tried) and plan.adaptive.passed == pytest.approx(passed)


def test_a_pruned_verify_is_costed_by_the_tokens_it_checked() -> None:
    """A verify whose rows checked fewer drafts than k files its time under b + sum(lengths) tokens, so the
    verify's cost by tokens stays true while a floor prunes (and adaptive k, and the floor itself, read it)."""
    plan = PlanK()
    plan.for_plan(0, "sd", K, True, draft_batch=[1, 2])
    pruned = [0, 1, 0, 0, 2, 0, 0, 1, 0, 0]  # a floor left most rows' drafts unverified
    plan.on_verify(1, K, [0] * len(pruned), 7.5, range(len(pruned)), pruned)
    plan.on_verify(2, K, ACCEPTED, 9.0, range(len(ACCEPTED)))  # fixed k: b(k + 1)
    assert plan.adaptive is not None
    assert plan.adaptive.verify.view() == {len(pruned) + 4: 7.5, len(ACCEPTED) * (K + 1): 9.0}


def verify_event(step: int, lengths: list[int] | None) -> control_pb2.WorkerEvent:
    event = control_pb2.WorkerEvent(step=step)
    v = event.verdicts
    v.seq_ids.extend(range(100, 100 + len(ACCEPTED)))
    v.counts.extend(n + 1 for n in ACCEPTED)
    v.accepted.extend(ACCEPTED)
    v.tokens.extend([5] * sum(n + 1 for n in ACCEPTED))
    if lengths is not None:
        v.drafted.extend(lengths)
    return event


@pytest.mark.parametrize("ragged", [True, False], ids=["tetris", "fixed-k"])
def test_the_step_driver_learns_from_the_verdicts_lengths(tmp_path: Path, ragged: bool) -> None:
    """A verifier event carrying per-row lengths reaches the estimate as those lengths (and the drafted total
    counts them); one without them is a fixed-k step of the plan's k."""
    stack = Stack(word_tokenizer(tmp_path / "tok"), ManagerConfig(mode="psd", k=K), accept=lambda s, i: 0)
    driver = stack.driver
    driver.k_plan.adaptive = AdaptiveK(k_max=5)
    driver._drafted_at[4] = (K, "psd")
    driver.in_flight = 1
    driver.on_verifier_event(verify_event(4, LENGTHS if ragged else None))
    passed, tried = hand_count(5, LENGTHS if ragged else [K] * len(ACCEPTED), ACCEPTED)
    assert driver.k_plan.adaptive.tried == pytest.approx(tried)
    assert driver.k_plan.adaptive.passed == pytest.approx(passed)
    assert driver.counters.drafted == (sum(LENGTHS) if ragged else K * len(ACCEPTED))
