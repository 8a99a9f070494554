"""`python3 -m minedraft.bench.gpu.step_trace`: the engine step's GPU timeline, per cell.

The cells of the step table (step_cells.py: AR, SD verify, the draft's k steps, SD colocated's fused
cycle) run a block of plain consecutive steps under torch.profiler, with the step table's phase hooks
recorded as "phase:" ranges on the host. step_timeline.py then says, per step: the kernels by kind,
the kernel-boundary gaps, and the host phase the GPU waited on during each longer gap (the host work
still on the critical path, which the step table's whole / GPU ratio counts but does not name).

    python3 -m minedraft.bench.gpu.step_trace --out /tmp/trace [--weights bf16,fp8] \
        [--cells ar:1,ar:64,verify:16:4,draft:64:4,fused:16:4] [--steps 8]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from minedraft.bench.gpu.phase_clock import Patches, PhaseClock
from minedraft.bench.gpu.step_cells import Cell, CellDriver, phase_hooks
from minedraft.bench.gpu.step_profile import StepConfig, engine_pair, prompts
from minedraft.bench.gpu.step_timeline import PHASE_PREFIX, summarize
from minedraft.bench.gpu.timing import log
from minedraft.bench.gpu.trace_summary import load_events

DEFAULT_CELLS = "ar:1,ar:16,ar:64,verify:1:4,verify:16:4,verify:64:4,draft:1:4,draft:64:4,fused:1:4,fused:64:4"


def parse_cells(text: str) -> list[Cell]:
    cells = []
    for item in filter(None, text.split(",")):
        parts = item.split(":")
        mode, batch, k = parts[0], int(parts[1]), int(parts[2]) if len(parts) > 2 else 0
        if mode not in ("ar", "verify", "draft", "fused") or (mode != "ar" and k < 1):
            raise SystemExit(f"bad cell {item!r}: mode:batch[:k], mode one of ar, verify, draft, fused (k >= 1)")
        cells.append(Cell(mode, batch, k))
    return cells


def recorded(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def ranged(*args: Any, **kwargs: Any) -> Any:
            with torch.profiler.record_function(PHASE_PREFIX + name):
                return fn(*args, **kwargs)
        return ranged
    return make


def trace_cell(driver: CellDriver, steps: int, warm: int = 3) -> dict:
    """One block of `steps` plain steps (the next plan waiting, as in the step table's whole block)."""
    from torch.profiler import ProfilerActivity, profile

    device = driver.verifier.runner.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    driver.setup()
    for _ in range(warm):
        driver.step()
    sync()
    extra = [(h.owner, h.attr, recorded(h.phase)) for h in phase_hooks()]
    with Patches(PhaseClock(), [], extra), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for j in range(steps):
            driver.step(ahead=j + 1 < steps)
        sync()
    driver.teardown()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = load_events(path)
    timeline = summarize(events, steps).as_dict()
    return {"mode": driver.cell.mode, "batch": driver.cell.batch, "k": driver.cell.k, **timeline}


def run(cells: list[Cell], weights: list[str], steps: int, device: str, shape: str = "llama3-8b") -> list[dict]:
    cfg = StepConfig(shape=shape, batches=tuple(sorted({c.batch for c in cells})),
                     ks=tuple(sorted({c.k for c in cells if c.k})), device=device)
    rows: list[dict] = []
    for w in weights:
        verifier, drafter = engine_pair(cfg, w, needs_draft=any(c.mode in ("draft", "fused") for c in cells))
        batch_prompts = prompts(cfg, verifier.vocab_size)
        for i, cell in enumerate(cells):
            driver = CellDriver(verifier, drafter, cell, 1000 * (i + 1), batch_prompts[: cell.batch])
            row = {"weights": w, **trace_cell(driver, steps)}
            rows.append(row)
            log(f"{w} {cell.mode} b={cell.batch} k={cell.k}: wall {row['wall_ms']:.3f} busy {row['busy_ms']:.3f} "
                f"kernels {row['kernels']} short gaps {row['short_gaps_ms']:.3f} long gaps {row['long_gaps_ms']:.3f}")
        del verifier, drafter
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return rows


def report_lines(rows: list[dict]) -> list[str]:
    """Two tables: the kernels by kind, and the GPU's waits by the host phase running then (ms per step)."""
    kinds = sorted({k for r in rows for k in r["by_kind_ms"]}, key=lambda k: -max(r["by_kind_ms"].get(k, 0)
                                                                                for r in rows))
    head = ["weights", "step", "batch", "k", "GPU wall", "busy", "kernels", "short gaps (n)", "long gaps"]
    lines = ["| " + " | ".join(head + kinds) + " |", "|" + "---|" * (len(head) + len(kinds))]
    for r in rows:
        cells = [r["weights"], r["mode"], str(r["batch"]), str(r["k"]), f"{r['wall_ms']:.3f}", f"{r['busy_ms']:.3f}",
                 str(r["kernels"]), f"{r['short_gaps_ms']:.3f} ({r['short_gaps']:.0f})", f"{r['long_gaps_ms']:.3f}"]
        cells += [f"{r['by_kind_ms'].get(k, 0):.3f} ({r['by_kind_count'].get(k, 0):.0f})" for k in kinds]
        lines.append("| " + " | ".join(cells) + " |")
    phases = sorted({p for r in rows for p in r["waited_on_ms"]}, key=lambda p: -sum(r["waited_on_ms"].get(p, 0)
                                                                                   for r in rows))
    lines += ["", "| weights | step | batch | k | long gaps | " + " | ".join(phases) + " |",
              "|" + "---|" * (5 + len(phases))]
    for r in rows:
        lines.append(f"| {r['weights']} | {r['mode']} | {r['batch']} | {r['k']} | {r['long_gaps_ms']:.3f} | "
                     + " | ".join(f"{r['waited_on_ms'].get(p, 0):.3f}" for p in phases) + " |")
    lines += ["", "Longest gaps (us, the host phases open at the gap's middle):", ""]
    for r in rows:
        gaps = "; ".join(f"{us:.0f} {where}" for us, where in r["largest_gaps_us"][:5])
        lines.append(f"- {r['weights']} {r['mode']} b={r['batch']} k={r['k']} ({r['long_gaps']:.1f} per step): {gaps}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m minedraft.bench.gpu.step_trace", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="step_trace_out")
    p.add_argument("--weights", default="bf16")
    p.add_argument("--cells", default=DEFAULT_CELLS, help="comma list of mode:batch[:k]")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--shape", default="llama3-8b", help="synthetic pair shape: llama3-8b | tiny")
    args = p.parse_args(argv)
    rows = run(parse_cells(args.cells), [w for w in args.weights.split(",") if w], args.steps, args.device, args.shape)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "step_trace.json").write_text(json.dumps(rows, indent=1))
    text = "\n".join(["# Engine step timeline (ms per step)", "", *report_lines(rows)]) + "\n"
    (out / "step_trace.md").write_text(text)
    print(text)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
