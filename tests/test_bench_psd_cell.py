"""The step profile's PSD cell (bench/gpu/step_cells.py, "psd"): the verifier executor really launches each
verify ahead over the loopback link (bench/gpu/loopback_plane.py), and what it commits equals the ordinary path's.
The SD-2GPU cell ("sd2") really takes every steady verify's drafts from the posted frame. Both with greedy rows and
with seeded sampled ones, whose drafts come with their probabilities."""

from __future__ import annotations

import pytest
import torch

from minedraft.bench.gpu import step_profile
from minedraft.bench.gpu.loopback_plane import LoopbackDrafts, LoopbackVerdicts
from minedraft.bench.gpu.step_cells import Cell, CellDriver
from minedraft.bench.gpu.step_profile import StepConfig
from minedraft.engine.verifier import Verifier

STEPS = 7


def run_cell(verifier: Verifier, first_id: int, ahead: bool, sampling: str = "greedy"
             ) -> tuple[CellDriver, LoopbackDrafts, dict[int, list[int]]]:
    cfg = StepConfig(shape="tiny", draft_layers=2, batches=(3,), ks=(2,), context=12, device="cpu")
    torch.manual_seed(5)  # the same drafts for both runs
    driver = CellDriver(verifier, None, Cell("psd", 3, 2, sampling), first_id,
                        step_profile.prompts(cfg, verifier.vocab_size))
    plane = driver.executor.plane  # type: ignore[union-attr]
    assert isinstance(plane, LoopbackDrafts)
    driver.setup()
    for j in range(STEPS):
        driver.step(ahead=ahead and j + 1 < STEPS)
    tokens = {s - first_id: list(verifier.seqs[s].tokens) for s in driver.ids}
    return driver, plane, tokens


@pytest.mark.parametrize("sampling", ["greedy", "sampled"])
def test_the_psd_cell_launches_every_verify_ahead_and_commits_what_the_ordinary_path_does(sampling: str) -> None:
    """Sampled rows too: their drafts' probabilities come with the frame and the draws are keyed by seed and
    position, so the launched verifies commit exactly the ordinary path's tokens."""
    cfg = StepConfig(shape="tiny", draft_layers=2, batches=(3,), ks=(2,), context=12, num_blocks=256, device="cpu")
    verifier, _ = step_profile.engine_pair(cfg, "bf16", needs_draft=False)

    ahead, plane, launched_tokens = run_cell(verifier, 1000, ahead=True, sampling=sampling)
    assert all(verifier.seqs[s].params.greedy == (sampling == "greedy") for s in ahead.ids)
    assert ahead.batches == [[1000, 1001, 1002], [1003, 1004, 1005]]
    executor = ahead.executor
    assert executor is not None
    assert executor.launched_count == STEPS - 1  # every plan but a block's first came launched ahead
    # the block's first verify takes its drafts unread too (posted_drafts.py); only B's prefill reads its frame
    assert executor.posted_count == 1 and plane.taken == STEPS and plane.received == 1
    assert executor.plane is plane  # no header mismatch dropped the link
    ahead.teardown()

    plain, plane, plain_tokens = run_cell(verifier, 2000, ahead=False, sampling=sampling)
    assert plain.executor is not None and plain.executor.launched_count == 0
    assert plain.executor.posted_count == STEPS and plane.taken == STEPS and plane.received == 1
    plain.teardown()

    assert launched_tokens == plain_tokens
    grown = [len(t) - 12 for t in launched_tokens.values()]
    # setup: A's prefill (1 token), B's prefill and verify (1..3); then each batch is verified 3 or 4 times
    assert all(g >= 4 for g in grown), grown
    assert not verifier.seqs


def run_draft_cell(first_id: int, launch_ahead: bool) -> tuple[CellDriver, LoopbackVerdicts, dict[int, list[int]]]:
    cfg = StepConfig(shape="tiny", draft_layers=2, batches=(3,), ks=(2,), context=12, num_blocks=256, device="cpu")
    _, drafter = step_profile.engine_pair(cfg, "bf16", needs_draft=True)
    assert drafter is not None
    torch.manual_seed(5)  # the same verdicts for both runs
    driver = CellDriver(drafter, drafter, Cell("psd-draft", 3, 2), first_id,  # type: ignore[arg-type]
                        step_profile.prompts(cfg, drafter.vocab_size))
    executor = driver.draft_executor
    assert executor is not None and isinstance(executor.plane, LoopbackVerdicts)
    executor.launch_ahead = launch_ahead
    plane = executor.plane
    driver.setup()
    for j in range(STEPS):
        driver.step(ahead=j + 1 < STEPS)
    tokens = {s - first_id: list(drafter.seqs[s].tokens) for s in driver.ids}
    return driver, plane, tokens


def test_the_psd_draft_cell_drafts_each_plan_from_the_verdict_on_the_device_as_the_ordinary_path_would() -> None:
    """The draft service's own loop over the loopback verdicts: with launch-ahead every timed plan after the
    first is queued during the plan before it, from a verdict never read on the host first; the sequences then
    hold what reading each verdict, committing it and proposing (launch-ahead off) leaves."""
    ahead, plane, ahead_tokens = run_draft_cell(1000, launch_ahead=True)
    executor = ahead.draft_executor
    assert executor is not None and executor.plane is plane  # no header mismatch dropped the link
    assert ahead.launched() == (STEPS, STEPS + 2)  # setup's two plans draft from no verdict
    assert plane.taken == STEPS and plane.received == 0 and plane.sent == STEPS + 2
    ahead.teardown()

    plain, plane, plain_tokens = run_draft_cell(2000, launch_ahead=False)
    assert plain.launched() == (0, STEPS + 2) and plane.taken == 0 and plane.received == STEPS
    plain.teardown()

    assert ahead_tokens == plain_tokens
    # each batch was drafted from 3 or 4 verdicts: row i accepts i % 3 drafts, then the bonus token
    grown = [len(t) - 12 for t in ahead_tokens.values()]
    assert grown == [n * (1 + i % 3) for n in (4, 3) for i in range(3)], grown


@pytest.mark.parametrize("sampling", ["greedy", "sampled"])
def test_the_sd2_cell_takes_every_steady_verifys_drafts_unread_and_commits_what_the_host_read_path_does(sampling: str
                                                                                                       ) -> None:
    """Sequential SD with the draft service on its own GPU: each plan verifies the batch the plan before it drafted,
    with the drafts (and, sampled, their probabilities) of the posted frame (verifier/posted_drafts.py), never
    launched ahead (its rows are the ones the verdict before it changes); the sequences then hold what the same
    cell leaves when every frame is read on the host first, and (greedy, exact whatever the drafts) what the
    verify cell, whose first verify has drafts too, leaves."""
    cfg = StepConfig(shape="tiny", draft_layers=2, batches=(3,), ks=(2,), context=12, num_blocks=256, device="cpu")
    verifier, _ = step_profile.engine_pair(cfg, "bf16", needs_draft=False)
    held = {}
    runs = [("sd2", 1000, True), ("sd2", 2000, False)] + ([("verify", 3000, True)] if sampling == "greedy" else [])
    for mode, first_id, posted in runs:
        torch.manual_seed(5)  # the same drafts for every run
        driver = CellDriver(verifier, None, Cell(mode, 3, 2, sampling), first_id,
                            step_profile.prompts(cfg, verifier.vocab_size)[:3], land_ms=2.0)
        executor = driver.executor
        assert executor is not None
        executor.launch_ahead = posted  # off: each frame is read on the host before its verify is prepared
        driver.setup()
        for j in range(STEPS):
            driver.step(ahead=j + 1 < STEPS)
        assert executor.launched_count == 0
        if mode == "sd2":
            plane = executor.plane
            assert isinstance(plane, LoopbackDrafts) and plane.land_cycles == 0 and driver.land_ms == 0.0  # CPU
            assert (executor.posted_count, plane.taken, plane.received) == ((STEPS, STEPS, 0) if posted else
                                                                            (0, 0, STEPS))
            assert driver.batches == [[first_id, first_id + 1, first_id + 2]]
        held[(mode, posted)] = {s - first_id: list(verifier.seqs[s].tokens) for s in driver.ids}
        driver.teardown()
    assert held[("sd2", True)] == held[("sd2", False)] == held.get(("verify", True), held[("sd2", False)])
    assert all(len(t) - 12 >= 1 + STEPS for t in held[("sd2", True)].values())
    assert not verifier.seqs
