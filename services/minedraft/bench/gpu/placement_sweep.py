"""`python -m minedraft.bench.gpu.placement_sweep`: PSD against SD colocated, through the services.

For each acceptance level, on the peaked synthetic 8B pair (`:agree=A`, greedy margins far above bf16
rounding, so every configuration's greedy output must equal AR's): AR and SD colocated on GPU 0
(one verifier with the draft beside the target), SD with the draft on GPU 1, PSD at equal (m/2+m/2)
and doubled (m+m) concurrency, and auto (adaptive k) against fixed k; at `--tetris-ms` also SD colocated
and PSD m+m with TETRIS selection. Each level runs once per target weight format (`--weights`: bf16, FP8)
and drafter (`--drafters`: the draft model, or a synthetic EAGLE-3 head; sweep_pairs.py). Every cell is
warmed up at its own shape and timed `--reps` times (placements.py). Writes results.json and results.md
under --out after every cell, and prints the summary last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from minedraft.batch_manager.policy import two_batches
from minedraft.bench.flags import int_list
from minedraft.bench.fp8_quantizer import WEIGHT_FORMATS
from minedraft.bench.gpu.placement_report import summary_lines
from minedraft.bench.gpu.placements import (
    PairSpecs,
    agreement,
    colocated_stack,
    log_tails,
    measure,
    split_stack,
    start_together,
)
from minedraft.bench.gpu.step_report import ModelBytes, bound_ms, draft_bytes
from minedraft.bench.gpu.sweep_pairs import DRAFTERS, PROMPT_LEN, level_bytes, level_pair
from minedraft.bench.gpu.timing import ceilings, log
from minedraft.bench.peaked_head import agree_for_acceptance
from minedraft.bundled import TINY_TARGET


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minedraft.bench.gpu.placement_sweep", description=__doc__)
    p.add_argument("--out", default="bench_out")
    p.add_argument("--shape", default="llama3-8b")
    p.add_argument("--draft-layers", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.02, help="deep-layer scale of the target (cost only here)")
    p.add_argument("--acceptance", default="0.7,0.5,0.9", help="levels (acceptance at k=4); the first gets the grid")
    p.add_argument("--ks", type=int_list, default=[4, 6])
    p.add_argument("--ms", type=int_list, default=[8, 16, 32, 64])
    p.add_argument("--small-ks", type=int_list, default=[4])
    p.add_argument("--small-ms", type=int_list, default=[16, 64])
    p.add_argument("--auto-ms", type=int_list, default=[16, 32], help="m of the auto vs fixed-k runs (PSD m+m)")
    p.add_argument("--auto-fixed-ks", type=int_list, default=[2, 4, 6], help="fixed k that auto is compared with")
    p.add_argument("--auto-k-max", type=int, default=6)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--num-blocks", type=int, default=2048)
    p.add_argument("--deadline-s", type=float, default=1e9, help="start no new cell after this many seconds")
    p.add_argument("--tp-size", type=int, default=1,
                   help="N: the target over GPUs 0..N-1 in both placements; the draft service on GPU N")
    p.add_argument("--colocated-only", action="store_true",
                   help="one GPU: AR and SD colocated only (no draft service, no PSD)")
    p.add_argument("--weights", default="bf16", help=f"the target's formats, a level each: {', '.join(WEIGHT_FORMATS)}")
    p.add_argument("--drafters", default="model", help=f"what drafts, a level each: {', '.join(DRAFTERS)}")
    p.add_argument("--eagle-vocab", type=int, default=32000, help="the EAGLE head's draft vocabulary (0: the target's)")
    p.add_argument("--tetris-ms", type=int_list, default=[], help="m of SD colocated and PSD m+m with TETRIS selection")
    p.add_argument("--tetris-extra", type=int, default=0, help="TETRIS: drafts per sequence beyond k")
    p.add_argument("--device-type", default="cuda", help="where the services build the models (cpu: a CPU check)")
    p.add_argument("--copy-gbps", type=float, default=0.0,
                   help="the bounds' bandwidth (0: measured on GPU 0 before the stacks start; none on the CPU)")
    p.add_argument("--tokenizer", default=str(TINY_TARGET),
                   help="the batch manager's tokenizer folder (no more ids than the shape's vocabulary)")
    return p


class Sweep:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.results: dict = {"args": vars(args), "rows": [], "errors": []}
        self.ar_outputs: dict[int, list[list[int]]] = {}  # the level's AR outputs by m: every cell's reference
        self.level_bytes: tuple[ModelBytes, ModelBytes] | None = None  # what the level's target and drafter read
        self.copy_GBps = args.copy_gbps

    def time_left(self) -> bool:
        return time.monotonic() - self.started < self.args.deadline_s

    def save(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1))
        (self.out / "results.md").write_text("\n".join(summary_lines(self.results["rows"])) + "\n")

    def cell(self, stack, config: str, mode: str, k: int, prompts: list[list[int]], gpus: int, tags: dict,
             reference: list[list[int]] | None, policy: dict | None = None) -> list[list[int]]:
        # Every width auto may reach was captured when level() started the stacks (capture_k).
        row, outputs = measure(stack, mode, k, prompts, self.args.max_tokens, self.args.reps, policy=policy)
        row.update(config=config, mode=mode, k=k, gpus=gpus, **tags, **self.bounds(mode, k, len(prompts)))
        if reference is not None:
            row.update(agreement(outputs, reference))
        self.results["rows"].append(row)
        self.save()
        exact = f", {row['rows_equal_ar']}/{row['rows_compared']} rows = AR" if reference is not None else ""
        if row["graph_capture_ms"]:
            exact += f", {row['graph_capture_ms']:.0f} ms capturing CUDA graphs inside the timed runs"
        log(f"{tags} {config} k={k} conc={len(prompts)}: {row['tokens_per_s']:.0f} tok/s "
            f"[{row['tokens_per_s_min']:.0f}-{row['tokens_per_s_max']:.0f}], step {row['step_ms']:.2f} ms (draft "
            f"{row['draft_ms']:.2f}, verify {row['verify_ms']:.2f}), acceptance {row['acceptance']:.3f}{exact}")
        return outputs

    def bounds(self, mode: str, k: int, requests: int) -> dict[str, float]:
        """The bandwidth bound of one verify and of one proposal of k drafts of a batch (PSD: half the requests),
        at the run's mean context (prompt plus half the output): the bytes they read over the copy rate."""
        if not self.copy_GBps or self.level_bytes is None:
            return {}
        target, draft = self.level_bytes
        batch = requests // 2 if two_batches(mode) else requests
        context = [PROMPT_LEN + self.args.max_tokens // 2] * batch
        return {"copy_GBps": self.copy_GBps, "verify_bound_ms": bound_ms(target.forward(context), self.copy_GBps),
                "draft_bound_ms": bound_ms(draft_bytes(draft, context, k), self.copy_GBps) if mode != "ar" else 0.0}

    def level(self, goal: float, full: bool, weights: str = "bf16", drafter: str = "model") -> None:
        a = self.args
        agree = agree_for_acceptance(goal)
        ks, ms = (a.ks, a.ms) if full else (a.small_ks, a.small_ms)
        seqs = 2 * max(ms + a.auto_ms + a.tetris_ms)
        made = level_pair(a.shape, a.alpha, a.draft_layers, agree, weights, drafter, seqs, a.eagle_vocab,
                          f"{a.device_type}:0" if a.device_type == "cuda" else a.device_type)
        pair, prompts = PairSpecs(made.target, made.draft, made.draft_kind, a.tokenizer), made.prompts
        self.level_bytes = level_bytes(made, a.shape, a.draft_layers)
        widest = max([*ks, *a.auto_fixed_ks, a.auto_k_max])  # every shape any cell uses, captured at start-up
        colocated = colocated_stack(pair, a.num_blocks, seqs, a.tp_size, capture_k=widest, device_type=a.device_type)
        split = None if a.colocated_only else split_stack(pair, a.num_blocks, seqs, a.tp_size, capture_k=widest,
                                                          device_type=a.device_type)
        n = a.tp_size
        tags = {"goal": goal, "agree": agree, "tp_size": a.tp_size, "weights": weights, "drafter": drafter}
        self.ar_outputs = {}
        self.results.setdefault("levels", []).append(
            {**tags, "target": pair.target, "draft": pair.draft, "logs": {
                "colocated": str(colocated.cfg.log_dir), "split": str(split.cfg.log_dir) if split else ""}})
        try:
            t0 = time.monotonic()
            start_together(colocated, split)
            log(f"level {goal} (agree {agree}, {weights}, {drafter}): stacks ready in {time.monotonic() - t0:.0f} s")
            for m in ms:
                if not self.time_left():
                    break
                ar = self.ar_outputs[m] = self.cell(colocated, "AR", "ar", 1, prompts[:m], n, {**tags, "m": m}, None)
                for k in ks:
                    if not self.time_left():
                        break
                    t = {**tags, "m": m}
                    self.cell(colocated, "SD colocated", "sd", k, prompts[:m], n, t, ar)
                    if split is None:
                        continue
                    self.cell(split, "SD-2GPU", "sd", k, prompts[:m], n + 1, t, ar)
                    self.cell(split, "PSD m/2+m/2", "psd", k, prompts[:m], n + 1, t, ar)
                    self.cell(split, "PSD m+m", "psd", k, prompts[: 2 * m], n + 1, t, ar)
            for m in a.auto_ms if split is not None else []:
                for k in [k for k in a.auto_fixed_ks if k not in ks or m not in ms]:
                    if self.time_left():
                        self.cell(split, "PSD m+m", "psd", k, prompts[: 2 * m], n + 1, {**tags, "m": m}, None)
                if self.time_left():
                    self.cell(split, "PSD m+m auto", "auto", a.auto_k_max, prompts[: 2 * m], n + 1,
                              {**tags, "m": m}, None)
            self.tetris_cells(colocated, split, ks, ms, prompts, tags)
        except Exception as exc:  # keep what was measured; say what broke
            log(f"level {goal} ({weights}, {drafter}) failed: {exc!r}")
            self.results["errors"].append({"goal": goal, "weights": weights, "drafter": drafter, "error": repr(exc),
                                           "colocated": log_tails(colocated),
                                           "split": log_tails(split) if split is not None else {}})
        finally:
            colocated.stop(grace=20)
            if split is not None:
                split.stop(grace=20)
            self.save()

    def tetris_cells(self, colocated, split, ks: list[int], measured_ms: list[int], prompts: list[list[int]],
                     tags: dict) -> None:
        """At each --tetris-ms m and k: SD colocated and PSD m+m with TETRIS selection, beside the same cells with
        fixed k and AR (measured here unless the level's grid has this m already)."""
        tetris = {"draft_selection": "tetris", "tetris_extra": self.args.tetris_extra, "tetris_min_batch": 1}
        n = self.args.tp_size
        for m in self.args.tetris_ms:
            if not self.time_left():
                return
            t = {**tags, "m": m}
            fresh = m not in measured_ms
            ar = self.cell(colocated, "AR", "ar", 1, prompts[:m], n, t, None) if fresh else self.ar_outputs[m]
            for k in ks:
                for config, stack, mode, rows, gpus in (("SD colocated", colocated, "sd", m, n),
                                                        ("PSD m+m", split, "psd", 2 * m, n + 1)):
                    if stack is None or not self.time_left():
                        continue
                    if fresh:
                        self.cell(stack, config, mode, k, prompts[:rows], gpus, t, ar)
                    self.cell(stack, f"{config} TETRIS", mode, k, prompts[:rows], gpus, t, ar, tetris)

    def run(self) -> int:
        if not self.copy_GBps and self.args.device_type == "cuda":
            self.copy_GBps = measured_copy_rate()
        goals = [float(g) for g in self.args.acceptance.split(",")]
        levels = [(w, d) for w in self.args.weights.split(",") if w for d in self.args.drafters.split(",") if d]
        for weights, drafter in levels:
            for i, goal in enumerate(goals):
                if not self.time_left():
                    log(f"deadline reached: level {goal} ({weights}, {drafter}) not measured")
                    break
                self.level(goal, full=i == 0, weights=weights, drafter=drafter)
        self.save()
        print("\n".join(summary_lines(self.results["rows"])), flush=True)
        return 0


def measured_copy_rate() -> float:
    """GPU 0's copy bandwidth, its buffers handed back before any service needs the memory."""
    import torch

    rate = ceilings()["copy_GBps"]
    torch.cuda.empty_cache()
    log(f"copy bandwidth of GPU 0: {rate:.0f} GB/s")
    return rate


def main(argv: list[str] | None = None) -> int:
    return Sweep(build_parser().parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
