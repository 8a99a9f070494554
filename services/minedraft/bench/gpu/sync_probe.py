"""`python3 -m minedraft.bench.gpu.sync_probe`: where an engine step makes the host wait for the GPU.

A step launched ahead keeps the GPU fed only if nothing between its launch and its readback synchronises
the host with the device: one `.item()`, a copy from pageable memory or a boolean-mask index stalls the
host until the GPU drains, and the step's host work is back in line. This runs step-profile cells
(step_cells.py) with torch's sync debug mode on and reports each synchronising call by the innermost engine
frame that made it, with the host's own time per function (cProfile) beside, per cell.

    python3 -m minedraft.bench.gpu.sync_probe --out /tmp/syncs --cells ar:1,ar:1:penalties,psd:16:penalties
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch

from minedraft.bench.gpu.step_cells import Cell, CellDriver
from minedraft.bench.gpu.step_profile import StepConfig, engine_pair, prompts


def parse_cells(text: str) -> list[Cell]:
    """mode:batch[:k][:sampling] items, comma-separated (k defaults to 4 except for AR)."""
    cells = []
    for item in filter(None, text.split(",")):
        parts = item.split(":")
        mode, batch = parts[0], int(parts[1])
        k = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else (0 if mode == "ar" else 4)
        sampling = parts[-1] if not parts[-1].isdigit() and len(parts) > 2 else "greedy"
        cells.append(Cell(mode, batch, k, sampling))
    return cells


def caller(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frame in the project's code (the call that synchronised), with the one that called it."""
    ours = [f for f in stack if "minedraft" in f.filename and "sync_probe" not in f.filename]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(ours[-2:])) or "elsewhere"


def probe(driver: CellDriver, steps: int) -> dict:
    """Sync sites and host time of `steps` steps, each with the next plan waiting (as on a loaded server)."""
    driver.setup()
    for _ in range(3):
        driver.step(ahead=True)
    sites: Counter[str] = Counter()

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        sites[caller(traceback.extract_stack()[:-1])] += 1

    profile = cProfile.Profile()
    original = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            profile.enable()
            for j in range(steps):
                driver.step(ahead=j + 1 < steps)
            profile.disable()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = original
    driver.teardown()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
    return {"syncs_per_step": {site: n / steps for site, n in sites.most_common()}, "host_profile": text.getvalue()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m minedraft.bench.gpu.sync_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="sync_probe_out")
    p.add_argument("--shape", default="llama3-8b")
    p.add_argument("--cells", default="ar:1,ar:1:penalties,ar:64:penalties,psd:16,psd:16:penalties")
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("sync_probe needs a CUDA device", file=sys.stderr)
        return 2
    cells = parse_cells(args.cells)
    cfg = StepConfig(shape=args.shape, batches=tuple(sorted({c.batch for c in cells})),
                     ks=tuple(sorted({c.k for c in cells if c.k})) or (4,))
    verifier, drafter = engine_pair(cfg, "bf16", any(c.mode in ("draft", "psd-draft", "fused") for c in cells))
    rows = []
    for i, cell in enumerate(cells):
        batch_prompts = prompts(cfg, verifier.vocab_size)[: cell.sequences]
        driver = CellDriver(verifier, drafter, cell, 1000 * (i + 1), batch_prompts)
        result = probe(driver, args.steps)
        rows.append({"mode": cell.mode, "batch": cell.batch, "k": cell.k, "sampling": cell.sampling, **result})
        print(f"== {cell.mode} b={cell.batch} k={cell.k} {cell.sampling}: syncs per step")
        for site, n in result["syncs_per_step"].items():
            print(f"  {n:6.2f}  {site}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sync_probe.json").write_text(json.dumps(rows, indent=1))
    (out / "host_profiles.txt").write_text("\n".join(
        f"== {r['mode']} b={r['batch']} k={r['k']} {r['sampling']}\n{r['host_profile']}" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
