"""TETRIS's side of the plan (batch_manager/draft_budget.py): when selection is on, how many drafts a plan carries,
how many the batch verifies (C = k x batch) and the floor theta = m x R below which none is verified, from synthetic
cost tables; with no extra drafts the floor alone prunes; through the step loop, auto's C follows adaptive k's k,
plans carry the floor and AR plans select nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from minedraft.batch_manager import draft_budget
from minedraft.batch_manager.adaptive_k import AdaptiveK
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.draft_budget import (
    COMPUTE_BOUND,
    MAX_MIN_PROB,
    extra_drafts,
    min_prob,
    plan_drafts,
    verify_bound,
)
from minedraft.batch_manager.policy import check_policy
from minedraft.core.errors import InvalidRequestError
from tests.fake_worker_links import greedy
from tests.step_driver_support import Stack, drive, word_tokenizer


def tetris(**fields: object) -> ManagerConfig:
    return ManagerConfig(**{"mode": "psd", "k": 4, "draft_selection": "tetris", "tetris_extra": 3,  # type: ignore[arg-type]
                            "tetris_min_batch": 8, **fields})


def measured(k: int, batch: int, base_ms: float, more_ms: float, extra: int = 3) -> AdaptiveK:
    """Verify costs measured at b(k + 1) and b(k + extra + 1) tokens."""
    est = AdaptiveK(k_max=k)
    est.verify.add(k, base_ms, batch)
    est.verify.add(k + extra, more_ms, batch)
    return est


def test_extra_drafts_only_with_tetris_and_not_in_ar() -> None:
    assert extra_drafts(tetris()) == 3
    assert extra_drafts(tetris(tetris_extra=5, mode="auto")) == 5
    assert extra_drafts(tetris(draft_selection="fixed")) == 0
    assert extra_drafts(tetris(mode="ar")) == 0  # AR drafts nothing: KV admission reserves no extra


def test_below_the_minimum_batch_selection_is_off() -> None:
    cfg = tetris(tetris_min_batch=8)
    assert plan_drafts(cfg, 4, 7, None) == (4, 0, 0.0)
    assert plan_drafts(cfg, 4, 1, None) == (4, 0, 0.0)
    assert plan_drafts(cfg, 4, 8, None) == (7, 32, 0.0)


@pytest.mark.parametrize(("k", "batch"), [(1, 8), (2, 9), (4, 32), (6, 64)])
def test_the_budget_is_k_times_the_batch(k: int, batch: int) -> None:
    """Drafts per sequence k + extra; verified drafts over the batch C = k x batch (fixed k's verify tokens)."""
    assert plan_drafts(tetris(), k, batch, None) == (k + 3, k * batch, 0.0)
    assert plan_drafts(tetris(tetris_extra=1), k, batch, AdaptiveK(k_max=max(k, 1))) == (k + 1, k * batch, 0.0)


def test_fixed_selection_verifies_every_draft() -> None:
    assert plan_drafts(tetris(draft_selection="fixed"), 4, 64, None) == (4, 0, 0.0)


def test_edge_cases_empty_batch_k_zero_and_ar() -> None:
    assert plan_drafts(tetris(tetris_min_batch=1), 4, 0, None) == (4, 0, 0.0)  # nothing drafts: nothing to select
    assert plan_drafts(tetris(tetris_min_batch=1), 0, 16, None) == (0, 0, 0.0)  # k = 0: no drafts, no budget
    assert plan_drafts(tetris(mode="ar", tetris_min_batch=1), 4, 16, None) == (4, 0, 0.0)


def test_flat_verify_costs_turn_selection_off() -> None:
    """The verify costs the same with the extra drafts (weights' read dominates): cutting drafts only loses."""
    est = measured(4, 32, 6.0, 6.1)
    assert not verify_bound(est, 32, 4, 3)
    assert plan_drafts(tetris(), 4, 32, est) == (4, 0, 0.0)


def test_compute_bound_verify_costs_keep_it_on() -> None:
    est = measured(4, 32, 6.0, 7.5)
    assert verify_bound(est, 32, 4, 3)
    assert plan_drafts(tetris(), 4, 32, est) == (7, 128, 0.0)


def test_the_threshold_is_five_percent_more() -> None:
    assert COMPUTE_BOUND == 0.05
    assert plan_drafts(tetris(), 4, 32, measured(4, 32, 8.0, 8.4)) == (7, 128, 0.0)  # exactly 5% more: on
    assert plan_drafts(tetris(), 4, 32, measured(4, 32, 8.0, 8.39)) == (4, 0, 0.0)  # just under: off


def test_costs_that_cannot_tell_leave_it_on() -> None:
    """No verify measured, one token count measured, or the extra drafts' count beyond what was measured."""
    assert verify_bound(None, 32, 4, 3)
    assert verify_bound(AdaptiveK(k_max=4), 32, 4, 3)
    one = AdaptiveK(k_max=4)
    one.verify.add(4, 6.0, 32)
    assert verify_bound(one, 32, 4, 3)
    small = AdaptiveK(k_max=4)  # measured around 2-3 drafts per sequence only: 7 + 1 per sequence is a guess
    small.verify.add(1, 6.0, 32)
    small.verify.add(2, 6.0, 32)
    assert verify_bound(small, 32, 4, 3)
    assert plan_drafts(tetris(), 4, 32, small) == (7, 128, 0.0)


def run_requests(tmp_path: Path, config: ManagerConfig, prompts: list[list[int]]) -> tuple[Stack, list[list[int]]]:
    async def scenario() -> None:
        await stack.coordinator.start()
        try:
            outputs.extend(await asyncio.gather(*(stack.run(p, 12) for p in prompts)))
        finally:
            await stack.coordinator.stop()

    stack = Stack(word_tokenizer(tmp_path / "tok"), config, lambda seq, step: 99)
    outputs: list[list[int]] = []
    drive(scenario)
    return stack, outputs


def test_auto_budgets_by_adaptive_ks_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In auto the plan's k is adaptive k's choice (here 2, not the policy's 4), and C follows it."""
    monkeypatch.setattr(AdaptiveK, "choose", lambda self, overlapped=True, batch=0: 2)
    monkeypatch.setattr(AdaptiveK, "choose_to_finish", lambda self, to_go, overlapped=True: 2)
    prompts = [[3 + i, 7, 9] for i in range(6)]
    stack, outputs = run_requests(tmp_path, tetris(mode="auto", tetris_min_batch=1, auto_min_tokens_per_step=1.0),
                                  prompts)
    assert outputs == [greedy(p, 12) for p in prompts]
    drafting = [p for p in stack.verifier.plans if p.with_drafts and p.draft_batch]
    assert drafting, "auto must have drafted"
    assert all(p.k == 2 + 3 and p.draft_budget == 2 * len(p.draft_batch) for p in drafting)


def test_ar_plans_select_nothing(tmp_path: Path) -> None:
    prompts = [[5 + i, 8] for i in range(4)]
    stack, outputs = run_requests(tmp_path, tetris(mode="ar", tetris_min_batch=1), prompts)
    assert outputs == [greedy(p, 12) for p in prompts]
    plans = stack.verifier.plans
    assert plans and all(not p.with_drafts and not p.draft_batch and p.draft_budget == 0 for p in plans)


def costed(verify_below: float, verify_at: float, draft_ms: float, k: int = 4, batch: int = 32) -> AdaptiveK:
    """Verify costs measured at bk and b(k + 1) tokens and a draft cost at k, for a batch of `batch`; acceptance
    at its prior (0.8 a position: E(4) = 3.3616)."""
    est = AdaptiveK(k_max=k)
    est.verify.add(k - 1, verify_below, batch)
    est.verify.add(k, verify_at, batch)
    est.draft.add(k, draft_ms, batch)
    return est


E4 = 1 + 0.8 + 0.8**2 + 0.8**3 + 0.8**4


def test_the_floor_is_m_times_r_when_the_verify_adds_to_the_step() -> None:
    """m: 1 ms more for the 32 tokens of each sequence's 4th draft; R: b E(4) tokens over the step's ms."""
    est = costed(8.0, 9.0, 5.0)
    assert min_prob(est, 32, 4, overlapped=False) == pytest.approx(1.0 / 32 * 32 * E4 / (9.0 + 5.0))  # SD: ~0.24
    assert min_prob(est, 32, 4, overlapped=True) == pytest.approx(1.0 / 32 * 32 * E4 / 9.0)  # PSD, verify-bound
    assert plan_drafts(tetris(mode="sd"), 4, 32, est) == (7, 128, pytest.approx(E4 / 14.0))


def test_no_floor_while_costs_are_unmeasured_or_the_verify_hides_under_the_draft() -> None:
    assert min_prob(None, 32, 4, overlapped=False) == 0.0
    assert min_prob(AdaptiveK(k_max=4), 32, 4, overlapped=False) == 0.0
    no_draft = AdaptiveK(k_max=4)
    no_draft.verify.add(3, 8.0, 32)
    no_draft.verify.add(4, 9.0, 32)
    assert min_prob(no_draft, 32, 4, overlapped=False) == 0.0  # the step's ms is not known yet
    one_count = AdaptiveK(k_max=4)
    one_count.verify.add(4, 9.0, 32)
    one_count.draft.add(4, 5.0, 32)
    assert min_prob(one_count, 32, 4, overlapped=False) == 0.0  # no slope to read
    assert min_prob(costed(8.0, 9.0, 5.0), 32, 6, overlapped=False) == 0.0  # beyond what adaptive k tracks
    draft_bound = costed(8.0, 9.0, 12.0)
    assert min_prob(draft_bound, 32, 4, overlapped=True) == 0.0  # PSD: the verify adds nothing to the step
    assert min_prob(draft_bound, 32, 4, overlapped=False) > 0.0  # SD: it does
    assert plan_drafts(tetris(), 4, 32, draft_bound) == (7, 128, 0.0)  # psd: the budget alone


def test_the_floor_is_clamped() -> None:
    """m = 4 ms / 32 tokens and R ~6 tokens per ms would put it at ~0.8: noise must not prune sure drafts."""
    assert min_prob(costed(8.0, 12.0, 5.0), 32, 4, overlapped=False) == MAX_MIN_PROB == 0.5


def test_no_extra_drafts_prunes_by_the_floor_alone() -> None:
    """extra 0: draft k, budget k x b (covers every draft), the floor prunes; without a floor, fixed k."""
    cfg = tetris(mode="sd", tetris_extra=0)
    assert extra_drafts(cfg) == 0  # KV admission reserves k
    assert plan_drafts(cfg, 4, 32, None) == (4, 0, 0.0)
    assert plan_drafts(cfg, 4, 32, costed(8.0, 9.0, 5.0)) == (4, 128, pytest.approx(E4 / 14.0))
    assert plan_drafts(cfg, 4, 7, costed(8.0, 9.0, 5.0)) == (4, 0, 0.0)  # below tetris_min_batch
    assert plan_drafts(tetris(mode="psd", tetris_extra=0), 4, 32, costed(8.0, 9.0, 12.0)) == (4, 0, 0.0)


def test_with_no_extra_drafts_the_bottleneck_rule_weighs_each_sequences_kth_draft() -> None:
    """b(k + 1) tokens against bk: 8.0 -> 8.4 ms is 5% (on), 8.0 -> 8.2 is not (off, the floor unused)."""
    assert verify_bound(costed(8.0, 8.4, 5.0), 32, 4, 0)
    assert not verify_bound(costed(8.0, 8.2, 5.0), 32, 4, 0)
    assert min_prob(costed(8.0, 8.2, 5.0), 32, 4, overlapped=False) > 0.0
    assert plan_drafts(tetris(mode="sd", tetris_extra=0), 4, 32, costed(8.0, 8.2, 5.0)) == (4, 0, 0.0)


def test_the_policy_allows_no_extra_drafts() -> None:
    check_policy({"tetris_extra": 0})
    with pytest.raises(InvalidRequestError):
        check_policy({"tetris_extra": -1})
    with pytest.raises(InvalidRequestError):
        check_policy({"tetris_extra": 9})


def test_plans_carry_the_floor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prune-only TETRIS through the step loop: each drafting plan drafts k, budgets k x batch and names the
    floor; the output is AR's."""
    monkeypatch.setattr(draft_budget, "min_prob", lambda adaptive, batch, k, overlapped: 0.3)
    prompts = [[4 + i, 6, 2] for i in range(5)]
    stack, outputs = run_requests(tmp_path, tetris(tetris_extra=0, tetris_min_batch=1), prompts)
    assert outputs == [greedy(p, 12) for p in prompts]
    drafting = [p for p in stack.verifier.plans if p.with_drafts and p.draft_batch]
    assert drafting and all((p.k, p.draft_budget, p.draft_min_prob) == (4, 4 * len(p.draft_batch), 0.3)
                            for p in drafting)
