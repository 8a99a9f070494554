"""Adaptive k for fused SD (a colocated verifier, auto mode): one time per plan for its verify and its draft,
learnt as the cycle's cost of the k the plan drafted; the choice adds the halves, as SD spends them."""

from __future__ import annotations

import random

from minedraft.batch_manager.plan_k import PlanK
from minedraft.batch_manager.policy import two_batches
from minedraft.batch_manager.scheduler import TwoBatchScheduler
from tests.test_adaptive_k import accepted_counts


def sd_rate(p: float, k: int, fixed_ms: float, per_draft_ms: float) -> float:
    return sum(p**i for i in range(k + 1)) / (fixed_ms + per_draft_ms * k)


def run_fused(p: float, fixed_ms: float, per_draft_ms: float, k_max: int, plans: int) -> tuple[PlanK, list[int]]:
    """Fused plans over 8 sequences whose drafts are each right with probability p. As on a GPU, a plan's
    host time holds the previous plan's draft (queued, not waited for) and the verify of its drafts: a
    fixed verify plus `per_draft_ms` per token of the previous plan's k."""
    rng = random.Random(7)
    plan = PlanK(lambda: True)
    ks = []
    previous = 0
    for step in range(plans):
        k = plan.for_plan(step, "auto", k_max, True, draft_batch=list(range(8)),
                          verify_batch=list(range(8)) if step else [])
        ks.append(k)
        if previous:
            accepted = accepted_counts(p, previous, 8, rng)
            plan.on_verify(step, previous, accepted, fixed_ms + per_draft_ms * previous)
        previous = k
    return plan, ks


def test_fused_auto_settles_on_the_k_with_the_most_tokens_per_ms_of_a_whole_cycle() -> None:
    for p, fixed, per_draft, best in ((0.8, 2.0, 1.0, 2), (0.9, 6.0, 0.5, 6), (0.5, 3.0, 1.5, 1)):
        assert best == max(range(1, 7), key=lambda k: sd_rate(p, k, fixed, per_draft))  # the brute-force optimum
        plan, ks = run_fused(p, fixed, per_draft, 6, 120)
        assert ks[0] == 6  # nothing measured yet: the widest
        assert ks[-20:].count(best) >= 18, (p, ks[-20:])
        assert plan.adaptive is not None and set(plan.adaptive.verify.view().values()) == {0.0}


def test_a_colocated_verifier_runs_auto_on_one_batch_and_psd_on_two() -> None:
    assert two_batches("auto") and two_batches("psd") and not two_batches("sd")
    assert not two_batches("auto", colocated=True) and two_batches("psd", colocated=True)
    sched = TwoBatchScheduler(two_batches("auto", colocated=True))
    sched.fuse_sd = True
    assert sched.fused
