"""TETRIS on the synthetic pair, on the CPU (bench/tetris_cells.py): with a draft that is unsure where it is
wrong (`calib` > 0) selection verifies more of the right drafts than fixed k at the same verify budget;
with today's always-sure draft it keeps exactly fixed k's slots. Greedy output equals AR's throughout."""

from __future__ import annotations

import pytest
import torch

from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic
from minedraft.bench.tetris_bench import plan
from minedraft.bench.tetris_cells import CellConfig, run_cell
from minedraft.bench.tetris_report import equals_ar, summaries
from minedraft.engine.model import CausalLM

CFG = CellConfig("cpu", steps=5, warmup=0, anatomy_steps=1, prompt_len=8, num_blocks=96)
BATCH, K, EXTRA = 6, 2, 2


@pytest.fixture(scope="module")
def models() -> dict[str, CausalLM]:
    def build(role: str, calib: float) -> CausalLM:
        return build_synthetic(SyntheticSpec("small", role, 0.02, 2, 0.7, calib), "cpu", torch.float32)

    return {"target": build("target", 0.0), "sure": build("draft", 0.0), "calibrated": build("draft", 0.8)}


@pytest.fixture(scope="module")
def cells(models: dict[str, CausalLM]) -> dict[str, tuple[dict, list[list[int]]]]:
    out = {"ar": run_cell((models["target"], models["sure"]), CFG, BATCH, 0, 0)}
    for draft in ("sure", "calibrated"):
        pair = (models["target"], models[draft])
        out[f"fixed_{draft}"] = run_cell(pair, CFG, BATCH, K, 0)
        out[f"tetris_{draft}"] = run_cell(pair, CFG, BATCH, K, EXTRA)
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
    assert plan([8], [4, 6], [1, 2]) == [(8, 0, 0), (8, 4, 0), (8, 4, 1), (8, 4, 2), (8, 6, 0), (8, 6, 1),
                                         (8, 6, 2)]
