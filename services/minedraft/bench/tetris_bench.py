"""`python -m minedraft.bench.tetris_bench`: TETRIS against fixed k and AR on a full batch, in one process.

Drives a Verifier and a Drafter directly (SD colocated, no services): B sequences decode together; every step
drafts (fixed k, or k + extra selected down to k x B, or nothing for AR), verifies and commits
(bench/tetris_cells.py). Per cell: accepted tokens per verified token (what selection improves: the verify
checks at most B + C tokens either way), tokens per step, tokens/s and, in a separate phase-timed pass, draft
and verify ms per step; TETRIS cells (`--extras`, 0: draft k and only prune; selected on the device, the
verify queued behind the draft, or with `--host-select` also read back first) verify no draft the draft rates
below `--min-prob` (auto: theta = m x R from this run's AR and fixed-k cells at the batch,
bench/tetris_report.measured_floor; 0: the budget alone); then per batch TETRIS / best fixed k and TETRIS / AR
(bench/tetris_report.py). Greedy, so each row's tokens must equal AR's; the script checks that too (exit 1 if
not). Pairs: model folders (default the bundled tiny pair, on the CPU) or `--synthetic SHAPE`
(bench/synthetic_pair.py, peaked heads with `--agree`, a draft unsure on a share `--calib` of its wrong
choices). Writes JSON to --out after every cell.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from minedraft.bench.flags import int_list
from minedraft.bench.tetris_cells import CellConfig, DraftPolicy, run_cell
from minedraft.bench.tetris_report import against_fixed, equals_ar, measured_floor, summaries, summary_line
from minedraft.engine.loader import load_model
from minedraft.engine.model import CausalLM


def models(args: argparse.Namespace) -> tuple[CausalLM, CausalLM]:
    dtype = getattr(torch, args.dtype)
    if args.synthetic:
        from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic

        spec = SyntheticSpec(args.synthetic, "target", draft_layers=args.draft_layers, agree=args.agree,
                             calib=args.calib, miscal=args.miscal)
        target, draft = spec.pair()
        return build_synthetic(target, args.device, dtype), build_synthetic(draft, args.device, dtype)
    from minedraft.bundled import TINY_DRAFT, TINY_TARGET

    return (load_model(args.target or TINY_TARGET, args.device, dtype),
            load_model(args.draft or TINY_DRAFT, args.device, dtype))


def plan(batches: list[int], ks: list[int], extras: list[int], host_too: bool = False, tiles: tuple[int, ...] = (0,)
         ) -> list[tuple[int, int, int, bool, bool, int]]:
    """(batch, k, extra, TETRIS, host selection, row tile) cells in running order: per batch AR first (the
    reference), then per k fixed, then TETRIS at each extra, once per row tile (0: the device's), with `host_too`
    followed by the same cell selecting with a readback before the verify: the floor of a TETRIS cell is read
    from the AR and fixed cells before it."""
    cells = []
    for b in batches:
        cells.append((b, 0, 0, False, False, 0))
        for k in ks:
            cells.append((b, k, 0, False, False, 0))
            for e in extras:
                cells += [(b, k, e, True, False, t) for t in tiles] + ([(b, k, e, True, True, 0)] if host_too else [])
    return cells


def min_prob_arg(text: str) -> str:
    if text != "auto" and not 0.0 <= float(text) < 1.0:
        raise argparse.ArgumentTypeError(f"--min-prob is auto or a probability below 1, got {text}")
    return text


def floor_of(cells: list[dict], batch: int, k: int, min_prob: str) -> dict:
    """A TETRIS cell's floor: `--min-prob` as given, or (auto) from the run's costs."""
    return measured_floor(cells, batch, k) if min_prob == "auto" else {"min_prob": float(min_prob)}


def sweep(pair: tuple[CausalLM, CausalLM], cfg: CellConfig, args: argparse.Namespace, deadline: float,
          report: dict) -> bool:
    """Runs the cells into report["cells"] (writing --out after each) until the deadline; False if a row
    left AR's tokens."""
    exact = True
    references: dict[int, list[list[int]]] = {}
    for batch, k, extra, tetris, host, tile in plan(args.batches, args.ks, args.extras, args.host_select,
                                                    tuple(args.tiles)):
        if time.monotonic() > deadline or (k and batch not in references):
            report["skipped"].append({"batch": batch, "k": k, "extra": extra, "tetris": tetris, "host": host})
            continue
        floor = floor_of(report["cells"], batch, k, args.min_prob) if tetris else {"min_prob": 0.0}
        cell, tokens = run_cell(pair, cfg, batch, DraftPolicy(k, extra, tetris, floor["min_prob"], host, tile))
        if tetris:
            cell |= floor
        if k:
            cell["equals_ar"] = equals_ar(tokens, references[batch])
            exact &= cell["equals_ar"]
            cell |= against_fixed(cell, report["cells"])
        else:
            references[batch] = tokens
        report["cells"].append(cell)
        print(json.dumps(cell), flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return exact


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minedraft.bench.tetris_bench", description=__doc__)
    p.add_argument("--target", default="")
    p.add_argument("--draft", default="")
    p.add_argument("--synthetic", default="", help="a synthetic shape (llama3-8b, small) instead of folders")
    p.add_argument("--agree", type=float, default=0.7)
    p.add_argument("--calib", type=float, default=0.0, help="share of the draft's wrong choices it is unsure of")
    p.add_argument("--miscal", type=float, default=0.0, help="share of its right choices it is unsure of")
    p.add_argument("--draft-layers", type=int, default=4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="float32: fast on a CPU")
    p.add_argument("--batches", type=int_list, default=[16, 32, 64])
    p.add_argument("--ks", type=int_list, default=[2, 4, 6])
    p.add_argument("--extras", "--extra", type=int_list, default=[0, 1, 2],
                   help="TETRIS drafts beyond k (0: draft k, prune by the floor only)")
    p.add_argument("--min-prob", type=min_prob_arg, default="auto",
                   help="TETRIS: floor on a verified draft's estimated acceptance (auto: m x R from this run's "
                   "measured costs; a number: that floor)")
    p.add_argument("--host-select", action="store_true",
                   help="also run each TETRIS cell with its selection read back before the verify")
    p.add_argument("--tiles", type=int_list, default=[0],
                   help="TETRIS on the device: the verify's cost steps in tokens to run each cell with (0: the "
                   "device's, 128 on CUDA, 1 on a CPU; engine/tetris_capacity.py)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--anatomy-steps", type=int, default=6, help="phase-timed steps after the timed ones")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--num-blocks", type=int, default=4096)
    p.add_argument("--deadline-s", type=float, default=1e9, help="start no new cell this long after the start")
    p.add_argument("--out", default="tetris_bench.json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    deadline = time.monotonic() + args.deadline_s
    pair = models(args)
    cfg = CellConfig(args.device, args.steps, args.warmup, args.anatomy_steps, args.prompt_len, args.num_blocks)
    report: dict = {"device": args.device, "synthetic": args.synthetic, "agree": args.agree, "calib": args.calib,
                    "miscal": args.miscal, "cells": [], "skipped": []}
    exact = sweep(pair, cfg, args, deadline, report)
    report["summaries"] = summaries(report["cells"])
    for summary in report["summaries"]:
        print(json.dumps(summary), flush=True)
        print(summary_line(summary), flush=True)
    if report["skipped"]:
        print(f"skipped {len(report['skipped'])} cells past the deadline", flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
