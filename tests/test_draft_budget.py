"""TETRIS's side of the plan (batch_manager/draft_budget.py): when selection is on, how many drafts a plan carries
and how many the batch verifies (C = k x batch); through the step loop, auto's C follows adaptive k's k and AR
plans select nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from minedraft.batch_manager.adaptive_k import AdaptiveK
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.draft_budget import COMPUTE_BOUND, extra_drafts, plan_drafts, verify_bound
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
    assert plan_drafts(cfg, 4, 7, None) == (4, 0)
    assert plan_drafts(cfg, 4, 1, None) == (4, 0)
    assert plan_drafts(cfg, 4, 8, None) == (7, 32)


@pytest.mark.parametrize(("k", "batch"), [(1, 8), (2, 9), (4, 32), (6, 64)])
def test_the_budget_is_k_times_the_batch(k: int, batch: int) -> None:
    """Drafts per sequence k + extra; verified drafts over the batch C = k x batch (fixed k's verify tokens)."""
    assert plan_drafts(tetris(), k, batch, None) == (k + 3, k * batch)
    assert plan_drafts(tetris(tetris_extra=1), k, batch, AdaptiveK(k_max=max(k, 1))) == (k + 1, k * batch)


def test_fixed_selection_verifies_every_draft() -> None:
    assert plan_drafts(tetris(draft_selection="fixed"), 4, 64, None) == (4, 0)


def test_edge_cases_empty_batch_k_zero_and_ar() -> None:
    assert plan_drafts(tetris(tetris_min_batch=1), 4, 0, None) == (4, 0)  # nothing drafts: nothing to select
    assert plan_drafts(tetris(tetris_min_batch=1), 0, 16, None) == (0, 0)  # k = 0: no drafts, no budget
    assert plan_drafts(tetris(mode="ar", tetris_min_batch=1), 4, 16, None) == (4, 0)


def test_flat_verify_costs_turn_selection_off() -> None:
    """The verify costs the same with the extra drafts (weights' read dominates): cutting drafts only loses."""
    est = measured(4, 32, 6.0, 6.1)
    assert not verify_bound(est, 32, 4, 3)
    assert plan_drafts(tetris(), 4, 32, est) == (4, 0)


def test_compute_bound_verify_costs_keep_it_on() -> None:
    est = measured(4, 32, 6.0, 7.5)
    assert verify_bound(est, 32, 4, 3)
    assert plan_drafts(tetris(), 4, 32, est) == (7, 128)


def test_the_threshold_is_five_percent_more() -> None:
    assert COMPUTE_BOUND == 0.05
    assert plan_drafts(tetris(), 4, 32, measured(4, 32, 8.0, 8.4)) == (7, 128)  # exactly 5% more: on
    assert plan_drafts(tetris(), 4, 32, measured(4, 32, 8.0, 8.39)) == (4, 0)  # just under: off


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
    assert plan_drafts(tetris(), 4, 32, small) == (7, 128)


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
