"""`python3 -m minedraft.bench.gpu.step_profile`: the engine step per batch size and k, on one GPU.

For each cell (AR; SD verify, the draft's k steps and SD colocated's fused cycle at each k; every batch
size) it reports the step's GPU time, its whole time and its bound (bytes / measured copy bandwidth),
and where the whole step's host time goes, by phase (step_cells.py measures, step_report.py renders).
The synthetic pair (bench/synthetic_pair.py) in bf16, and in FP8 with `--weights bf16,fp8` once the
FP8 quantizer exists. `minedraft bench gpu --step-table` runs the same cells inside the GPU sweep.

    python3 -m minedraft.bench.gpu.step_profile --out /tmp/steps [--step-batches 1,16,32,64] [--step-ks 4,6]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from minedraft.bench.flags import add_step_table_flags
from minedraft.bench.fp8_quantizer import WEIGHT_FORMATS, quantize_model
from minedraft.bench.gpu.step_cells import Cell, CellDriver, measure_cell
from minedraft.bench.gpu.step_report import DRAFTING, MODES, SAMPLINGS, report_lines
from minedraft.bench.gpu.timing import ceilings, log
from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic
from minedraft.engine.blas_plan import MODES as BLAS_MODES
from minedraft.engine.blas_plan import PLAN
from minedraft.engine.cuda_graphs import GraphCache
from minedraft.engine.drafter import Drafter
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier


@dataclass(frozen=True, slots=True)
class StepConfig:
    shape: str = "llama3-8b"
    draft_layers: int = 4
    alpha: float = 0.0269
    batches: tuple[int, ...] = (1, 16, 32, 64)
    ks: tuple[int, ...] = (4, 6)
    modes: tuple[str, ...] = MODES
    weights: tuple[str, ...] = ("bf16",)
    context: int = 128
    rounds: int = 4
    steps: int = 6
    num_blocks: int = 4096
    device: str = "cuda:0"
    copy_GBps: float = 0.0  # 0: measure it (and the bf16 matmul rate)
    matmul_TFLOPs: float = 0.0
    samplings: tuple[str, ...] = ("greedy",)  # step_report.SAMPLINGS: each cell once per kind of rows

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> StepConfig:
        modes = tuple(m for m in args.step_modes.split(",") if m)
        weights = tuple(w for w in args.weights.split(",") if w)
        samplings = tuple(s for s in getattr(args, "step_sampling", "greedy").split(",") if s)
        for name, given, known in (("mode", modes, MODES), ("weights", weights, WEIGHT_FORMATS),
                                   ("sampling", samplings, SAMPLINGS)):
            if unknown := [g for g in given if g not in known]:
                raise SystemExit(f"unknown {name} {unknown}; choose from {', '.join(known)}")
        return cls(args.shape, args.draft_layers, args.step_alpha, tuple(args.step_batches), tuple(args.step_ks),
                   modes, weights, args.step_context, args.step_rounds, args.step_steps, args.step_num_blocks,
                   getattr(args, "device", "cuda:0"), getattr(args, "copy_gbps", 0.0), samplings=samplings)

    def cells(self) -> list[Cell]:
        """AR first, then per k the verify, PSD's verify, the fused cycle, the draft and SD-2GPU's verify (whose
        drafts land the draft cell's GPU time after each verify: "sd2" brings the draft cells along); each once per
        sampling, next to each other (the draft's rows are never processed: its cells run once, greedy, whatever
        the samplings, so SD-2GPU's sampled verifies take their landing from the greedy draft cell)."""
        modes = {*self.modes, "draft"} if "sd2" in self.modes else set(self.modes)
        order = [m for m in ("ar", "verify", "psd", "fused", "draft", "sd2", "psd-draft") if m in modes]
        out = [Cell("ar", b, 0) for b in self.batches] if "ar" in order else []
        for k in self.ks:
            out += [Cell(mode, b, k) for mode in order if mode != "ar" for b in self.batches]
        return [Cell(c.mode, c.batch, c.k, s) for c in out
                for s in (("greedy",) if c.mode in DRAFTING else self.samplings)]


def load(cfg: StepConfig, role: str, weights: str) -> torch.nn.Module:
    """The synthetic pair member in bf16, or quantized in memory to FP8 (`bench/fp8_quantizer.py`)."""
    model = build_synthetic(SyntheticSpec(cfg.shape, role, cfg.alpha, cfg.draft_layers), cfg.device, torch.bfloat16)
    if WEIGHT_FORMATS[weights]:
        model = quantize_model(model, scheme=WEIGHT_FORMATS[weights])
    return model


def prompts(cfg: StepConfig, vocab: int) -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(3, vocab) for _ in range(cfg.context)] for _ in range(2 * max(cfg.batches))]


def capture(runner: ModelRunner, batches: Iterable[int], widths: Iterable[int], scoring: bool) -> int:
    """The CUDA graphs of the cells' steady steps, captured before any is timed (a server's --capture-batch
    and --capture-k do the same for every bucket up to theirs); other shapes then run eagerly."""
    if runner.graphs is None:
        return 0
    buckets = sorted({b for b in map(GraphCache.bucket, batches) if b is not None})
    widths = list(widths)
    return runner.graphs.capture_ahead((b, w, w if scoring else 1) for b in buckets for w in widths)


def engine_pair(cfg: StepConfig, weights: str, needs_draft: bool) -> tuple[Verifier, Drafter | None]:
    """The cells' verifier (and drafter) in one weight format on cfg's device, with the CUDA graph of every steady
    shape of cfg's batches and ks captured before anything is timed."""
    device = torch.device(cfg.device)
    verifier = Verifier(ModelRunner(load(cfg, "target", weights), cfg.num_blocks, 16, device))
    drafter = Drafter(ModelRunner(load(cfg, "draft", weights), cfg.num_blocks, 16, device)) if needs_draft else None
    captured = capture(verifier.runner, cfg.batches, sorted({1, *(k + 1 for k in cfg.ks)}), scoring=True)
    if drafter is not None:
        captured += capture(drafter.runner, cfg.batches, range(1, max([*cfg.ks, 1]) + 2), scoring=False)
    log(f"{weights} on {device}: {captured} CUDA graphs captured")
    return verifier, drafter


def draft_gpu_ms(rows: list[dict], weights: str, cell: Cell) -> float:
    """The GPU time of the draft's k steps at the cell's batch and k, measured earlier in this run (0 if not)."""
    for row in rows:
        if (row["mode"], row.get("weights"), row["batch"], row["k"]) == ("draft", weights, cell.batch, cell.k):
            return float(row["gpu_ms"])
    return 0.0


def profile(cfg: StepConfig, saved: Callable[[dict], None] | None = None) -> dict:
    """Every cell at every weight format (FP8: the bf16 synthetic pair quantized in memory). `saved` gets the
    results so far after each cell."""
    device = torch.device(cfg.device)
    measured = ceilings() if not cfg.copy_GBps else {"copy_GBps": cfg.copy_GBps, "bf16_TFLOPs": cfg.matmul_TFLOPs}
    copy, rate = measured["copy_GBps"], measured["bf16_TFLOPs"]
    results: dict = {"copy_GBps": copy, "matmul_TFLOPs": rate, "context": cfg.context, "shape": cfg.shape,
                     "rows": [], "errors": []}
    cells = cfg.cells()
    needs_draft = any(c.mode in (*DRAFTING, "fused") for c in cells)
    for weights in cfg.weights:
        verifier, drafter = engine_pair(cfg, weights, needs_draft)
        batch_prompts = prompts(cfg, verifier.vocab_size)
        for i, cell in enumerate(cells):
            land = draft_gpu_ms(results["rows"], weights, cell) if cell.mode == "sd2" else 0.0
            driver = CellDriver(verifier, drafter, cell, 1000 * (i + 1), batch_prompts[: cell.sequences], land)
            row = measure_cell(driver, copy, cfg.rounds, cfg.steps, matmul_TFLOPs=rate if weights == "bf16" else 0.0)
            row["weights"] = weights
            results["rows"].append(row)
            if saved is not None:
                saved(results)
            log(f"{weights} {cell.mode} {cell.sampling} b={cell.batch} k={cell.k}: GPU {row['gpu_ms']:.3f} ms, whole "
                f"{row['whole_ms']:.3f} ms, bound {row['bound_ms']:.3f} ms, late {row['late_segments']}")
        del verifier, drafter
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def write(results: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "step_profile.json").write_text(json.dumps(results, indent=1))
    path = out / "step_profile.md"
    path.write_text("\n".join(["# Engine step profile", "", *report_lines(results)]) + "\n")
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m minedraft.bench.gpu.step_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="step_profile_out")
    p.add_argument("--shape", default="llama3-8b", help="synthetic pair shape: llama3-8b | tiny")
    p.add_argument("--draft-layers", type=int, default=4)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--copy-gbps", type=float, default=0.0, help="the bound's bandwidth (0: measure the copy)")
    p.add_argument("--blas", choices=BLAS_MODES, default="auto",
                   help="the library of the bf16 projections, as the workers' --blas (engine/blas_plan.py)")
    add_step_table_flags(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    if torch.cuda.is_available():
        PLAN.configure(args.blas)
    results = profile(StepConfig.from_args(args), lambda so_far: write(so_far, out))
    results["blas"] = {"mode": args.blas, "choices": PLAN.table()}
    path = write(results, out)
    print(path.read_text())
    return 0 if results["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
