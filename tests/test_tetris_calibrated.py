"""TETRIS on the synthetic pair, on the CPU (bench/tetris_cells.py): with a draft that is unsure where it is
wrong (`calib` > 0) selection verifies more of the right drafts than fixed k at the same verify budget, and
a floor on the draft's estimated acceptance verifies fewer drafts for the same accepted ones; with today's
always-sure draft it keeps exactly fixed k's slots. Greedy output equals AR's throughout. The bench's
auto floor (theta = m x R) comes from the AR and fixed-k cells of its own run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from minedraft.batch_manager.draft_budget import MAX_MIN_PROB
from minedraft.bench import tetris_cells
from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic
from minedraft.bench.tetris_bench import main, plan
from minedraft.bench.tetris_cells import CellConfig, DraftPolicy, run_cell
from minedraft.bench.tetris_report import equals_ar, measured_floor, summaries
from minedraft.engine.drafter import Proposal
from minedraft.engine.model import CausalLM
from minedraft.engine.tetris_capacity import DraftCapacity

CFG = CellConfig("cpu", steps=5, warmup=0, anatomy_steps=1, prompt_len=8, num_blocks=96)
BATCH, K, EXTRA = 6, 2, 2
FLOOR = 0.5  # above a damped draft's usual max q (~0.3), far below an undamped one's (1.0)


@pytest.fixture(scope="module")
def models() -> dict[str, CausalLM]:
    def build(role: str, calib: float) -> CausalLM:
        return build_synthetic(SyntheticSpec("small", role, 0.02, 2, 0.7, calib), "cpu", torch.float32)

    return {"target": build("target", 0.0), "sure": build("draft", 0.0), "calibrated": build("draft", 0.8)}


@pytest.fixture(scope="module")
def cells(models: dict[str, CausalLM]) -> dict[str, tuple[dict, list[list[int]]]]:
    out = {"ar": run_cell((models["target"], models["sure"]), CFG, BATCH, DraftPolicy())}
    for draft in ("sure", "calibrated"):
        pair = (models["target"], models[draft])
        out[f"fixed_{draft}"] = run_cell(pair, CFG, BATCH, DraftPolicy(K))
        out[f"tetris_{draft}"] = run_cell(pair, CFG, BATCH, DraftPolicy(K, EXTRA, True))
    calibrated = (models["target"], models["calibrated"])
    out["prune_calibrated"] = run_cell(calibrated, CFG, BATCH, DraftPolicy(K, 0, True, FLOOR))
    out["prune_calibrated_host"] = run_cell(calibrated, CFG, BATCH, DraftPolicy(K, 0, True, FLOOR, host_select=True))
    out["tetris_floor_calibrated"] = run_cell(calibrated, CFG, BATCH, DraftPolicy(K, EXTRA, True, FLOOR))
    out["tetris_floor_calibrated_host"] = run_cell(calibrated, CFG, BATCH,
                                                   DraftPolicy(K, EXTRA, True, FLOOR, host_select=True))
    return out


def test_every_cell_emits_ars_tokens(cells: dict[str, tuple[dict, list[list[int]]]]) -> None:
    reference = cells["ar"][1]
    for name, (cell, tokens) in cells.items():
        assert equals_ar(tokens, reference), name
        assert min(len(t) for t in tokens) >= CFG.prompt_len + CFG.steps + CFG.anatomy_steps
        assert {"draft_ms", "verify_ms"} <= cell.keys()


def test_calibrated_selection_accepts_more_per_verified_token(cells: dict[str, tuple[dict, list[list[int]]]]
                                                              ) -> None:
    fixed, tetris = cells["fixed_calibrated"][0], cells["tetris_calibrated"][0]
    assert tetris["verified_tokens"] == fixed["verified_tokens"] == BATCH * (K + 1) * CFG.steps  # one budget
    assert tetris["accepted_per_verified_token"] > fixed["accepted_per_verified_token"]
    assert tetris["tokens_per_step"] > fixed["tokens_per_step"]


def test_a_floor_prunes_the_drafts_a_calibrated_draft_doubts(cells: dict[str, tuple[dict, list[list[int]]]]
                                                             ) -> None:
    """Prune-only TETRIS (extra 0) selected on the host verifies fewer tokens than fixed k and accepts as many:
    the draft is unsure only where it is wrong (miscal 0), so a pruned draft would have been rejected. On the
    device the capacity, fixed before drafting, follows the floor a step late (a step that wants more drafts
    than the last one drops those nearest the floor), and still accepts more per verified token than fixed k.
    With extra drafts the floor cuts below the budget too, and still accepts more per verified token than the
    budget alone."""
    fixed, host, pruned = (cells[name][0] for name in ("fixed_calibrated", "prune_calibrated_host",
                                                       "prune_calibrated"))
    assert pruned["min_prob"] == host["min_prob"] == FLOOR
    assert host["verified_tokens"] < fixed["verified_tokens"]
    assert host["accepted_tokens"] >= 0.95 * fixed["accepted_tokens"]
    assert pruned["verified_tokens"] < fixed["verified_tokens"]
    assert pruned["accepted_per_verified_token"] > fixed["accepted_per_verified_token"]
    budget_only, floored = cells["tetris_calibrated"][0], cells["tetris_floor_calibrated_host"][0]
    assert floored["verified_tokens"] < budget_only["verified_tokens"]
    assert floored["accepted_per_verified_token"] > budget_only["accepted_per_verified_token"]
    assert cells["tetris_floor_calibrated"][0]["verified_tokens"] < budget_only["verified_tokens"]


def test_a_selection_on_the_device_verifies_what_one_read_back_does(
        models: dict[str, CausalLM], cells: dict[str, tuple[dict, list[list[int]]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given as its capacity each step's count of drafts the floor kept on the host, a selection left on the
    device keeps the same slots (the best ones, which are those above the floor) and verifies and accepts
    exactly what the one read back before the verify does, step for step. The bench's own capacity (the last
    step's wanted count rounded up to a packed graph's tokens, set before drafting, and filled) differs by
    step; its cell still emits AR's tokens (test_every_cell_emits_ars_tokens) and counts each step's capacity."""
    host = cells["prune_calibrated_host"]
    assert host[0]["kind"] == "tetris-host" and "capacity_cuts" not in host[0]
    kept: list[int] = []
    chosen = tetris_cells.propose_selected

    def recording(*args: object) -> Proposal:
        proposal = chosen(*args)  # type: ignore[arg-type]
        assert proposal.lengths is not None
        kept.append(sum(proposal.lengths))
        return proposal

    monkeypatch.setattr(tetris_cells, "propose_selected", recording)
    pair = (models["target"], models["calibrated"])
    again = run_cell(pair, CFG, BATCH, DraftPolicy(K, 0, True, FLOOR, host_select=True))
    assert again[1] == host[1] and again[0]["verified_tokens"] == host[0]["verified_tokens"]
    assert len(kept) == CFG.warmup + CFG.steps + CFG.anatomy_steps
    monkeypatch.setattr(tetris_cells, "propose_selected", chosen)

    class HostCounts(DraftCapacity):
        def plan(self, batch: int, width: int, budget: int) -> tuple[int, int | None]:
            return budget, kept.pop(0)

    monkeypatch.setattr(tetris_cells, "DraftCapacity", HostCounts)
    device = run_cell(pair, CFG, BATCH, DraftPolicy(K, 0, True, FLOOR))
    assert device[0]["kind"] == "tetris" and device[0]["capacity_steps"] == CFG.warmup + CFG.steps + CFG.anatomy_steps
    assert device[0]["capacity_cuts"] == 0 and not kept
    assert (device[0]["verified_tokens"], device[0]["accepted_tokens"]) == (host[0]["verified_tokens"],
                                                                           host[0]["accepted_tokens"])
    assert device[1] == host[1]
    own = cells["prune_calibrated"][0]
    assert own["capacity_steps"] + own["plain_steps"] == device[0]["capacity_steps"] and own["tile"] == 1


def test_the_auto_floor_is_m_times_r_from_the_runs_own_cells() -> None:
    cells = [{"batch": 64, "kind": "ar", "k": 0, "tokens_per_s": 11000.0, "verify_ms": 5.5},
             {"batch": 64, "kind": "fixed", "k": 4, "tokens_per_s": 12000.0, "verify_ms": 9.74}]
    floor = measured_floor(cells, 64, 4)
    assert floor["marginal_verify_ms_per_token"] == pytest.approx((9.74 - 5.5) / 256, abs=1e-5)
    assert floor["min_prob"] == pytest.approx(12.0 * (9.74 - 5.5) / 256, abs=1e-4)  # ~0.2
    assert measured_floor(cells, 64, 6) == {"min_prob": 0.0}  # no fixed cell at k = 6
    fast = [{**c, "tokens_per_s": 60000.0} for c in cells]  # m x R ~1: clamped
    assert measured_floor(fast, 64, 4)["min_prob"] == MAX_MIN_PROB == 0.5
    assert measured_floor([{k: v for k, v in c.items() if k != "verify_ms"} for c in cells], 64, 4) == {
        "min_prob": 0.0}  # not phase-timed


def test_the_bench_prunes_by_its_own_costs_and_stays_exact(tmp_path: Path) -> None:
    out = tmp_path / "tetris.json"
    assert main(["--synthetic", "small", "--device", "cpu", "--dtype", "float32", "--batches", "6", "--ks", "2",
                 "--extras", "0,1", "--steps", "2", "--warmup", "0", "--anatomy-steps", "1", "--prompt-len", "8",
                 "--num-blocks", "96", "--calib", "0.8", "--out", str(out)]) == 0  # 1: a row left AR's tokens
    cells = json.loads(out.read_text())["cells"]
    assert [(c["kind"], c["extra"]) for c in cells] == [("ar", 0), ("fixed", 0), ("tetris", 0), ("tetris", 1)]
    expected = measured_floor(cells[:2], 6, 2)
    assert all(c["min_prob"] == expected["min_prob"] and c["equals_ar"] for c in cells[2:])
    assert "marginal_verify_ms_per_token" in cells[2]


def test_calib_changes_no_draft_choice_and_a_sure_draft_gives_selection_nothing(
        cells: dict[str, tuple[dict, list[list[int]]]]) -> None:
    sure, calibrated, tetris_sure = cells["fixed_sure"], cells["fixed_calibrated"], cells["tetris_sure"]
    assert sure[0]["accepted_tokens"] == calibrated[0]["accepted_tokens"]  # acceptance at agree is unchanged
    assert sure[1] == calibrated[1]
    assert tetris_sure[0]["accepted_tokens"] == sure[0]["accepted_tokens"]  # every slot ties: fixed k's kept
    assert tetris_sure[1] == sure[1]


def test_summary_ratios_compare_the_best_cells_of_a_batch() -> None:
    cells = [{"batch": 8, "kind": "ar", "k": 0, "extra": 0, "tokens_per_s": 100.0},
             {"batch": 8, "kind": "fixed", "k": 4, "extra": 0, "tokens_per_s": 150.0},
             {"batch": 8, "kind": "fixed", "k": 6, "extra": 0, "tokens_per_s": 160.0},
             {"batch": 8, "kind": "tetris", "k": 4, "extra": 2, "tokens_per_s": 200.0},
             {"batch": 16, "kind": "ar", "k": 0, "extra": 0, "tokens_per_s": 90.0}]
    (summary,) = summaries(cells)  # batch 16 has no SD cells: no summary
    assert summary["best_fixed"] == {"k": 6, "tokens_per_s": 160.0}
    assert (summary["tetris_over_best_fixed"], summary["tetris_over_ar"]) == (1.25, 2.0)
    assert plan([8], [4, 6], [0, 2]) == [(8, 0, 0, False, False, 0), (8, 4, 0, False, False, 0),
                                         (8, 4, 0, True, False, 0), (8, 4, 2, True, False, 0),
                                         (8, 6, 0, False, False, 0), (8, 6, 0, True, False, 0),
                                         (8, 6, 2, True, False, 0)]
    assert plan([8], [4], [1], host_too=True, tiles=(128, 1)) == [
        (8, 0, 0, False, False, 0), (8, 4, 0, False, False, 0), (8, 4, 1, True, False, 128),
        (8, 4, 1, True, False, 1), (8, 4, 1, True, True, 0)]
