"""The step profile's PSD cell (bench/gpu/step_cells.py, "psd"): the verifier executor really launches each
verify ahead over the loopback link (bench/gpu/loopback_plane.py), and what it commits equals the ordinary path's."""

from __future__ import annotations

import torch

from minedraft.bench.gpu import step_profile
from minedraft.bench.gpu.loopback_plane import LoopbackDrafts
from minedraft.bench.gpu.step_cells import Cell, CellDriver
from minedraft.bench.gpu.step_profile import StepConfig
from minedraft.engine.verifier import Verifier

STEPS = 7


def run_cell(verifier: Verifier, first_id: int, ahead: bool) -> tuple[CellDriver, LoopbackDrafts, dict[int, list[int]]]:
    cfg = StepConfig(shape="tiny", draft_layers=2, batches=(3,), ks=(2,), context=12, device="cpu")
    torch.manual_seed(5)  # the same drafts for both runs
    driver = CellDriver(verifier, None, Cell("psd", 3, 2), first_id, step_profile.prompts(cfg, verifier.vocab_size))
    plane = driver.executor.plane  # type: ignore[union-attr]
    assert isinstance(plane, LoopbackDrafts)
    driver.setup()
    for j in range(STEPS):
        driver.step(ahead=ahead and j + 1 < STEPS)
    tokens = {s - first_id: list(verifier.seqs[s].tokens) for s in driver.ids}
    return driver, plane, tokens


def test_the_psd_cell_launches_every_verify_ahead_and_commits_what_the_ordinary_path_does() -> None:
    cfg = StepConfig(shape="tiny", draft_layers=2, batches=(3,), ks=(2,), context=12, num_blocks=256, device="cpu")
    verifier, _ = step_profile.engine_pair(cfg, "bf16", needs_draft=False)

    ahead, plane, launched_tokens = run_cell(verifier, 1000, ahead=True)
    assert ahead.batches == [[1000, 1001, 1002], [1003, 1004, 1005]]
    executor = ahead.executor
    assert executor is not None
    assert executor.launched_count == STEPS - 1  # every plan but a block's first came launched ahead
    assert plane.taken == STEPS - 1 and plane.received == 2  # B's prefill and the block's first verify
    assert executor.plane is plane  # no header mismatch dropped the link
    ahead.teardown()

    plain, plane, plain_tokens = run_cell(verifier, 2000, ahead=False)
    assert plain.executor is not None and plain.executor.launched_count == 0 and plane.taken == 0
    plain.teardown()

    assert launched_tokens == plain_tokens
    grown = [len(t) - 12 for t in launched_tokens.values()]
    # setup: A's prefill (1 token), B's prefill and verify (1..3); then each batch is verified 3 or 4 times
    assert all(g >= 4 for g in grown), grown
    assert not verifier.seqs
