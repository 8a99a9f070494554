"""The engine-step profile (bench/gpu/step_profile.py): phase accounting, the bound's bytes, the tables, the
`minedraft bench gpu --step-table` wiring and a whole run of every cell kind on the CPU (no timing asserts)."""

from __future__ import annotations

import argparse
import json
import types
from dataclasses import replace
from pathlib import Path

import pytest

from minedraft.bench import flags
from minedraft.bench.gpu import report, step_profile
from minedraft.bench.gpu.phase_clock import OTHER, Hook, Patches, PhaseClock
from minedraft.bench.gpu.step_profile import StepConfig
from minedraft.bench.gpu.step_report import (
    ModelBytes,
    bound_ms,
    compute_ms,
    draft_bytes,
    merged_phases,
    phase_table,
    report_lines,
    step_flops,
    step_table,
    summarize,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_phases_get_exclusive_time_and_scopes_prefix_their_inner_phases() -> None:
    t = FakeClock()
    clock = PhaseClock(t)
    with clock.phase(OTHER):
        t.now += 1.0
        with clock.phase("commit"):
            t.now += 2.0
            with clock.phase("readback wait"):
                t.now += 4.0
            t.now += 8.0
        with clock.phase(OTHER, scope="draft"):
            t.now += 16.0
            with clock.phase("graph replay"):
                t.now += 32.0
        t.now += 64.0
    assert clock.take() == {OTHER: 65000.0, "commit": 10000.0, "readback wait": 4000.0, "draft: other": 16000.0,
                            "draft: graph replay": 32000.0}
    assert clock.take() == {}


class Base:
    def work(self, x: int) -> int:
        return x + 1


class Child(Base):
    def own(self) -> str:
        return "own"


def test_patches_wrap_methods_and_module_functions_and_put_them_back() -> None:
    t = FakeClock()
    clock = PhaseClock(t)
    module = types.SimpleNamespace(helper=lambda: t.__setattr__("now", t.now + 3.0))
    originals = (Base.__dict__["work"], Child.__dict__["own"], module.helper)
    with Patches(clock, [Hook(Child, "work", "inherited"), Hook(Child, "own", "own"), Hook(module, "helper", "h")]):
        assert Child().work(1) == 2 and Child().own() == "own"
        with clock.phase(OTHER):
            module.helper()
    assert clock.take()["h"] == 3000.0
    assert (Base.__dict__["work"], Child.__dict__["own"], module.helper) == originals
    assert "work" not in Child.__dict__  # the inherited method is inherited again


def test_bytes_and_bound() -> None:
    model = ModelBytes.of(1000, layers=2, kv_heads=4, head_dim=8, kv_elem=2)
    assert model.kv_per_token == 2 * 2 * 4 * 8 * 2
    assert model.forward([3, 5]) == 1000 + 8 * 256
    assert draft_bytes(model, [3, 5], 2) == model.forward([3, 5]) + model.forward([4, 6])
    assert bound_ms(4.22e9, 4220.0) == pytest.approx(1.0)


def row(mode: str, batch: int, k: int, gpu: float, whole: float, bound: float, **extra: object) -> dict:
    return {"mode": mode, "batch": batch, "k": k, "gpu_ms": gpu, "whole_ms": whole, "bound_ms": bound, **extra}


def test_summary_ratios_and_the_step_table_marks_missed_goals() -> None:
    done = summarize(row("ar", 1, 0, 4.0, 5.0, 3.9, phases={"commit": 0.2, "readback wait": 3.0, "draft: commit": 0.1}))
    assert done["bound_share"] == pytest.approx(0.78) and done["whole_over_gpu"] == pytest.approx(1.25)
    assert done["host_ms"] == pytest.approx(0.3)
    lines = step_table([row("verify", 64, 4, 6.0, 6.1, 5.6, weights="fp8"), row("ar", 16, 0, 4.0, 4.1, 3.8),
                        row("ar", 1, 0, 4.0, 5.0, 3.9), row("verify", 64, 6, 9.5, 10.0, 4.0, compute_ms=9.2)])
    assert lines[0].startswith("| weights | step | batch | k | GPU ms | whole ms | bound ms | compute ms")
    assert lines[2] == "| bf16 | AR | 1 | 0 | 4.00 | 5.00 | 3.90 | - | 78.0% * | 78.0% * | 1.250 * |"
    assert lines[3] == "| bf16 | AR | 16 | 0 | 4.00 | 4.10 | 3.80 | - | 92.7% | 92.7% | 1.025 |"
    assert lines[4] == "| bf16 | SD verify | 64 | 6 | 9.50 | 10.00 | 4.00 | 9.20 | 40.0% * | 92.0% | 1.053 * |"
    assert lines[5].startswith("| fp8 | SD verify | 64 | 4 |") and lines[5].endswith("| 91.8% | 91.8% | 1.017 |")


def test_the_compute_floor_counts_every_scored_and_drafted_token() -> None:
    target, draft = ModelBytes(0, 0, matmul_params=100), ModelBytes(0, 0, matmul_params=10)
    assert step_flops("ar", 16, 0, target, draft) == 2 * 100 * 16
    assert step_flops("verify", 16, 4, target, None) == 2 * 100 * 16 * 5
    assert step_flops("draft", 16, 4, target, draft) == 2 * 10 * 16 * 4
    assert step_flops("fused", 2, 6, target, draft) == 2 * 100 * 2 * 7 + 2 * 10 * 2 * 6
    assert compute_ms(7.67e11, 767.0) == pytest.approx(1.0) and compute_ms(1.0, 0.0) == 0.0


def test_phase_table_folds_the_drafts_phases_into_the_columns() -> None:
    merged, scoped = merged_phases({"commit": 0.5, "draft: commit": 0.25, "draft: other": 1.0, OTHER: 2.0})
    assert merged["commit"] == 0.75 and merged[OTHER] == 3.0 and scoped == 1.25
    lines = phase_table([row("fused", 16, 4, 9.0, 10.0, 8.0, phases={"commit": 0.5, "draft: commit": 0.25},
                             phased_whole_ms=10.5)])
    assert lines[2].startswith("| bf16 | SD colocated fused | 16 | 4 | 10.50 | 0.000 |")
    assert lines[2].endswith("| 0.750 | 0.000 | 0.250 |")


def test_report_lines_say_what_was_late_and_what_was_not_measured() -> None:
    results = {"copy_GBps": 4221.0, "context": 128, "errors": ["--weights fp8 needs FP8 support: ..."],
               "rows": [row("draft", 1, 4, 3.0, 3.5, 2.9, late_segments=2)]}
    text = "\n".join(report_lines(results))
    assert "copy bandwidth 4221 GB/s" in text and "draft (k steps) b=1 k=4 (2)" in text
    assert "Not measured: --weights fp8 needs FP8 support" in text
    assert report_lines({"rows": []}) == []


def sweep_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    flags.add_gpu_sweep_flags(p)
    return p.parse_args(argv)


def test_the_sweeps_flags_make_the_cells() -> None:
    cfg = StepConfig.from_args(sweep_args(["--step-only", "--step-batches", "1,64", "--step-ks", "4",
                                           "--step-modes", "ar,verify,fused", "--weights", "bf16,fp8"]))
    assert cfg.weights == ("bf16", "fp8") and cfg.device == "cuda:0"
    assert [(c.mode, c.batch, c.k) for c in cfg.cells()] == [
        ("ar", 1, 0), ("ar", 64, 0), ("verify", 1, 4), ("verify", 64, 4), ("fused", 1, 4), ("fused", 64, 4)]
    with pytest.raises(SystemExit, match="unknown weights"):
        StepConfig.from_args(sweep_args(["--weights", "int4"]))
    # sampled rows only: SD-2GPU's verify still has the (greedy) draft cell it takes its drafts' landing from
    sampled = StepConfig.from_args(sweep_args(["--step-only", "--step-batches", "16", "--step-ks", "4",
                                               "--step-modes", "sd2", "--step-sampling", "sampled"]))
    assert [(c.mode, c.sampling) for c in sampled.cells()] == [("draft", "greedy"), ("sd2", "sampled")]


def test_every_cell_kind_runs_on_the_cpu_in_both_weight_formats(tmp_path: Path) -> None:
    cfg = StepConfig(shape="tiny", draft_layers=2, batches=(2,), ks=(2,), weights=("bf16", "fp8"), context=20,
                     rounds=2, steps=1, num_blocks=128, device="cpu", copy_GBps=10.0)
    results = step_profile.profile(cfg)
    assert [(r["mode"], r["weights"]) for r in results["rows"]] == [
        (mode, weights) for weights in ("bf16", "fp8")
        for mode in ("ar", "verify", "psd", "fused", "draft", "sd2", "psd-draft")]
    assert results["errors"] == []
    for r in results["rows"]:
        assert r["steps"] == 2 and r["gpu_ms"] == 0.0 and r["bound_ms"] > 0
        assert sum(r["phases"].values()) == pytest.approx(r["phased_whole_ms"], rel=0.05)
    sd2 = next(r for r in results["rows"] if r["mode"] == "sd2")
    assert sd2["posted"] == 3 + 2 * 3 and sd2["land_ms"] == 0.0  # every warm-up and timed verify; no landing on CPU
    fused = next(r for r in results["rows"] if r["mode"] == "fused")
    assert fused["phases"]["plan decode"] > 0 and any(name.startswith("draft: ") for name in fused["phases"])
    md = step_profile.write(results, tmp_path).read_text()
    assert "| bf16 | SD colocated fused | 2 | 2 |" in md
    assert json.loads((tmp_path / "step_profile.json").read_text())["rows"][0]["mode"] == "ar"
    page = report.write_report({"ceilings": {"copy_GBps": 10.0, "bf16_TFLOPs": 1.0}, "step_table": results}, tmp_path)
    assert "| bf16 | AR | 2 | 0 |" in page.read_text() and "| alpha |" not in page.read_text()


def test_penalised_cells_process_their_rows_and_launch_ahead_beside_the_greedy_ones(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    from minedraft.engine.logits_processing import LogitsProcessing

    processed: list[int] = []
    apply = LogitsProcessing.apply

    def counted(self, logits, states, drafts, **kw):
        processed.append(len(states))
        return apply(self, logits, states, drafts, **kw)

    monkeypatch.setattr(LogitsProcessing, "apply", counted)
    args = sweep_args(["--step-only", "--step-batches", "2", "--step-ks", "2", "--step-modes", "ar,psd,draft",
                       "--step-sampling", "greedy,penalties"])
    assert [(c.mode, c.sampling) for c in StepConfig.from_args(args).cells()] == [
        ("ar", "greedy"), ("ar", "penalties"), ("psd", "greedy"), ("psd", "penalties"), ("draft", "greedy")]
    with pytest.raises(SystemExit, match="unknown sampling"):
        StepConfig.from_args(sweep_args(["--step-sampling", "beam"]))
    cfg = StepConfig(shape="tiny", draft_layers=2, batches=(2,), ks=(2,), modes=("ar", "psd"), context=20, rounds=2,
                     steps=3, num_blocks=128, device="cpu", copy_GBps=10.0, samplings=("greedy", "penalties"))
    rows = []
    for cell in cfg.cells():
        before = len(processed)
        rows.append(step_profile.profile(replace(cfg, modes=(cell.mode,), samplings=(cell.sampling,)))["rows"][0])
        assert (len(processed) > before) == (cell.sampling == "penalties"), cell
    # the executor launches the penalised steps ahead as it does the plain ones (verifier/ar_ahead.py, launch_ahead.py)
    assert [(r["mode"], r["sampling"], r["launched_ahead"] > 0) for r in rows] == [
        ("ar", "greedy", True), ("ar", "penalties", True), ("psd", "greedy", True), ("psd", "penalties", True)]
    md = "\n".join(step_table(rows))
    assert "| bf16 | AR, penalties | 2 | 0 |" in md and "| bf16 | AR | 2 | 0 |" in md



def test_sampled_and_logprobs_cells_launch_ahead_as_the_greedy_ones_do() -> None:
    """Sampled rows (drafts with their probabilities) and rows asking for logprobs take the launched paths too:
    AR steps and PSD verifies queued before the previous verdict is read back."""
    cfg = StepConfig(shape="tiny", draft_layers=2, batches=(2,), ks=(2,), modes=("ar", "psd"), context=20, rounds=2,
                     steps=3, num_blocks=128, device="cpu", copy_GBps=10.0, samplings=("sampled", "logprobs"))
    rows = [step_profile.profile(replace(cfg, modes=(c.mode,), samplings=(c.sampling,)))["rows"][0]
            for c in cfg.cells()]
    assert [(r["mode"], r["sampling"], r["launched_ahead"] > 0) for r in rows] == [
        ("ar", "sampled", True), ("ar", "logprobs", True), ("psd", "sampled", True), ("psd", "logprobs", True)]

def test_sd2_cycles_count_the_drafts_landing_as_device_time_and_take_it_from_the_draft_cell() -> None:
    done = summarize(row("sd2", 16, 4, 6.0, 10.5, 5.0, land_ms=4.4))
    assert done["whole_over_gpu"] == pytest.approx(10.5 / 10.4) and done["bound_share"] == pytest.approx(5.0 / 6.1)
    lines = step_table([row("sd2", 16, 4, 6.0, 10.5, 5.0, land_ms=4.4), row("verify", 16, 4, 6.0, 6.4, 5.0)])
    assert lines[2].startswith("| bf16 | SD verify | 16 | 4 | 6.00 | 6.40 |")
    assert lines[3] == "| bf16 | SD-2GPU verify (drafts posted) | 16 | 4 | 6.00 + 4.40 landing | 10.50 | 5.00 | - | " \
                       "82.0% * | 82.0% * | 1.010 |"
    assert "SD-2GPU verify: each plan's drafts land" in "\n".join(report_lines({"copy_GBps": 1.0, "rows": [done]}))
    cfg = StepConfig.from_args(sweep_args(["--step-batches", "1,16", "--step-ks", "4", "--step-modes", "ar,sd2"]))
    assert [(c.mode, c.batch) for c in cfg.cells()] == [("ar", 1), ("ar", 16), ("draft", 1), ("draft", 16),
                                                        ("sd2", 1), ("sd2", 16)]
    rows = [row("draft", 16, 4, 4.7, 5.0, 5.1, weights="bf16"), row("draft", 16, 4, 3.1, 3.4, 2.6, weights="fp8")]
    assert step_profile.draft_gpu_ms(rows, "fp8", cfg.cells()[-1]) == 3.1
    assert step_profile.draft_gpu_ms(rows, "bf16", cfg.cells()[-2]) == 0.0  # no draft cell at batch 1
