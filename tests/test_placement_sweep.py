"""The placement sweep's levels with an FP8 target, a synthetic EAGLE-3 head and TETRIS cells, run through the
real services on the CPU (gloo in place of NCCL, a tiny shape): the same code the two-GPU benchmark runs. Every
placement's greedy output must equal AR's, and AR's must equal the FP8 target's own."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from minedraft.bench.gpu import placement_sweep
from minedraft.bench.gpu.sweep_pairs import PROMPT_LEN, LevelPair, _weight_bytes, level_bytes, level_pair
from minedraft.bench.peaked_head import agree_for_acceptance
from minedraft.bench.synthetic_eagle import head_prompts, head_vocabulary
from minedraft.bench.synthetic_pair import SHAPES, load_synthetic
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.llm_engine import EngineConfig, LLMEngine
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier
from tests.conftest import write_word_tokenizer

CONFIGS = {"AR", "SD colocated", "SD-2GPU", "PSD m/2+m/2", "PSD m+m", "SD colocated TETRIS", "PSD m+m TETRIS"}


def test_an_fp8_target_with_an_eagle_head_runs_every_placement_and_tetris_exactly(tmp_path: Path) -> None:
    write_word_tokenizer(tmp_path, 512, 2)  # the tiny shape's vocabulary
    out = tmp_path / "sweep"
    args = ["--out", str(out), "--shape", "tiny", "--draft-layers", "2", "--acceptance", "0.7", "--ks", "2",
            "--ms", "2", "--auto-ms", "", "--tetris-ms", "2", "--max-tokens", "8", "--reps", "1", "--num-blocks", "256",
            "--weights", "fp8", "--drafters", "eagle", "--eagle-vocab", "256", "--device-type", "cpu",
            "--tokenizer", str(tmp_path), "--copy-gbps", "10"]
    sweep = placement_sweep.Sweep(placement_sweep.build_parser().parse_args(args))
    assert sweep.run() == 0
    results = json.loads((out / "results.json").read_text())
    assert results["errors"] == []
    rows = results["rows"]
    assert {r["config"] for r in rows} == CONFIGS
    assert all(r["weights"] == "fp8" and r["drafter"] == "eagle" for r in rows)
    for r in rows:
        if r["config"] != "AR":
            assert r["rows_equal_ar"] == r["rows_compared"] == 2, r["config"]
            assert r["steps"] > 0 and r["acceptance"] > 0.3, r["config"]  # the head's drafts were accepted
    # each service said what it loaded: the FP8 target on both verifiers, the head in the draft service
    (level,) = results["levels"]
    logs = {side: Path(folder) for side, folder in level["logs"].items()}
    for side in ("colocated", "split"):
        assert "weights FP8 (block scales)" in (logs[side] / "verifier.log").read_text(), side
    assert "EagleHead (decoder layers: 1)" in (logs["split"] / "draft.log").read_text()
    # the bounds beside the anatomy: the FP8 target's bytes per verify of a batch, the head's per proposal
    psd = next(r for r in rows if r["config"] == "PSD m+m")
    target, head = level_bytes(LevelPair(level["target"], level["draft"], "eagle", []), "tiny", 2)
    assert target.weights < _weight_bytes(SHAPES["tiny"], "") < 2 * target.weights  # projections at a byte
    context = [PROMPT_LEN + 4] * 2  # two rows per PSD batch, the mean context
    assert psd["verify_bound_ms"] == target.forward(context) / 10e6
    assert psd["draft_bound_ms"] == (2 * head.weights + head.kv_per_token * (2 * sum(context) + 2)) / 10e6
    report = (out / "results.md").read_text()
    assert "| 0.7 fp8 EAGLE | 2 | 2 |" in report and "| 0.7 fp8 EAGLE | 2 | 2 | PSD m+m |" in report
    # AR through the services is the FP8 target's own greedy output, built here from the same spec, on the prompts
    # whose greedy path the head's vocabulary holds
    pair = level_pair("tiny", 0.02, 2, agree_for_acceptance(0.7), "fp8", "model", 4, 256, "cpu")
    model = load_synthetic(pair.target, "cpu", torch.bfloat16)
    assert model.config.quantization is not None
    engine = LLMEngine(Verifier(ModelRunner(model, 256, 16, "cpu")), None, Tokenizer(tmp_path),
                       EngineConfig(mode="ar", device="cpu", dtype=torch.bfloat16))
    prompts = head_prompts(head_vocabulary(512, 256, 0).closed, 4, PROMPT_LEN, seed=13)[:2]
    expected = [r.output_ids for r in engine.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))]
    assert sweep.ar_outputs[2] == expected


def test_tetris_cells_alone_measure_their_own_ar_and_fixed_k(tmp_path: Path) -> None:
    """A TETRIS-only sweep (no grid): each TETRIS cell's AR and fixed-k cells are measured beside it."""
    write_word_tokenizer(tmp_path, 512, 2)
    args = ["--out", str(tmp_path / "sweep"), "--shape", "tiny", "--draft-layers", "2", "--acceptance", "0.7",
            "--ks", "2", "--ms", "", "--auto-ms", "", "--tetris-ms", "2", "--max-tokens", "8", "--reps", "1",
            "--num-blocks", "256", "--device-type", "cpu", "--tokenizer", str(tmp_path)]
    sweep = placement_sweep.Sweep(placement_sweep.build_parser().parse_args(args))
    assert sweep.run() == 0
    results = json.loads((tmp_path / "sweep" / "results.json").read_text())
    assert results["errors"] == []
    configs = [r["config"] for r in results["rows"]]
    assert configs == ["AR", "SD colocated", "SD colocated TETRIS", "PSD m+m", "PSD m+m TETRIS"]
    for r in results["rows"][1:]:
        assert r["rows_equal_ar"] == r["rows_compared"] == 2 and r["drafter"] == "model", r["config"]
    assert "verify_bound_ms" not in results["rows"][0]  # no copy rate on the CPU unless one is given
