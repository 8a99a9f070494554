"""`python -m minedraft.bench.gpu.anatomy_probe`: why a verify (or a draft) is slower inside PSD.

Issue 13 item 1. On split stacks (verifier on GPU 0, draft service on GPU 1, NCCL data plane), each
started with its own environment (a *variant*: `name` or `name:VAR=value,draft/VAR=value`, where
`process/VAR` sets a variable for one process only), this times SD
with the draft on its own GPU and PSD m+m at one (k, m) as the placement sweep does, then opens a
torch.profiler window of `--steps` steps on both workers for one more run of each and summarises
the traces (trace_summary.py): the same batch's verify in SD and inside PSD, kernel by kernel.
The stacks load together and are measured one after the other, so no two compete for a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from minedraft.bench import control_trace_report
from minedraft.bench.client import fetch_status, generate_all
from minedraft.bench.gpu.placements import PairSpecs, colocated_stack, measure, split_stack
from minedraft.bench.gpu.timing import log
from minedraft.bench.gpu.trace_summary import render, summarize
from minedraft.bench.peaked_head import agree_for_acceptance
from minedraft.bench.synthetic_pair import SyntheticSpec
from minedraft.bench.workload import random_prompts
from minedraft.cli.local_stack import LocalStack
from minedraft.observability.control_trace import ENV as CONTROL_TRACE_ENV
from minedraft.worker.torch_profile import DIR_ENV


def parse_variant(text: str) -> tuple[str, dict[str, str], dict[str, dict[str, str]]]:
    """(name, environment of every process, environment by process name)."""
    name, _, assignments = text.partition(":")
    env: dict[str, str] = {}
    by_process: dict[str, dict[str, str]] = {}
    for item in filter(None, assignments.split(",")):
        key, value = item.split("=", 1)
        process, _, var = key.rpartition("/")
        (by_process.setdefault(process, {}) if process else env)[var] = value
    return name, env, by_process


def parse_points(text: str) -> list[tuple[int, int]]:
    return [(int(k), int(m)) for k, m in (item.split("x") for item in text.split(","))]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minedraft.bench.gpu.anatomy_probe", description=__doc__)
    p.add_argument("--out", default="probe_out")
    p.add_argument("--variant", action="append", default=[],
                   help="name[:VAR=value,process/VAR=value,...], one split stack each")
    p.add_argument("--acceptance", type=float, default=0.7)
    p.add_argument("--points", type=parse_points, default=[(4, 16)], help="k x m cells, e.g. 4x16,6x16")
    p.add_argument("--steps", type=int, default=30, help="steps in each profiling window (first cell only; 0: none)")
    p.add_argument("--depths", default="2", help="pipeline depths the PSD cells run at, e.g. 2,3")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--num-blocks", type=int, default=2048)
    p.add_argument("--tp-size", type=int, default=1, help="the target over GPUs 0..N-1 (the draft service on GPU N)")
    p.add_argument("--ar-only", action="store_true",
                   help="no draft service: AR through a verifier over N GPUs (profiles every rank)")
    p.add_argument("--colocated-sd", action="store_true",
                   help="no draft service: the draft beside the target's rank 0; SD colocated cells, then AR")
    p.add_argument("--control-trace", action="store_true",
                   help="time each plan's round trip through the batch manager (MINEDRAFT_CONTROL_TRACE) and print "
                        "its parts for every cell once the stacks stop")
    return p


def profile_run(stack: LocalStack, folder: Path, label: str, prompts: list[list[int]], args,
                roles: list[str]) -> dict[str, dict]:
    """Ask the workers for a window, run the prompts once more, and summarise what they wrote."""
    for role in roles:
        (folder / f"{role}.request").write_text(f"{label} {args.steps}")
    asyncio.run(generate_all(stack.cfg.grpc_port, prompts, args.max_tokens))
    summaries = {}
    deadline = time.monotonic() + 120
    for role in roles:
        trace = folder / f"{role}-{label}.trace.json"
        while not trace.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.0)  # the exporter finishes writing
        if trace.exists():
            summaries[role] = summarize(trace)
            log(render(summaries[role]))
        else:
            log(f"no trace from {role} for {label}")
    return summaries


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    agree = agree_for_acceptance(args.acceptance)
    target, draft = SyntheticSpec("llama3-8b", "target", 0.02, 4, agree).pair()
    pair = PairSpecs(str(target), str(draft))
    widest = max(m for _, m in args.points)
    prompts = random_prompts(2 * widest, seed=13)
    stacks: dict[str, tuple[LocalStack, Path]] = {}
    colocated = args.ar_only or args.colocated_sd
    for text in args.variant or ["base"]:
        name, env, by_process = parse_variant(text)
        folder = (out / name).resolve()
        stack = (colocated_stack if colocated else split_stack)(pair, args.num_blocks, 2 * widest, args.tp_size,
                                                                capture_k=max(k for k, _ in args.points))
        process_env = {proc: {**stack.cfg.process_env.get(proc, {}), **extra} for proc, extra in by_process.items()}
        if args.control_trace:
            env = {**env, CONTROL_TRACE_ENV: str(folder / "control_trace")}
        stack.cfg = replace(stack.cfg, extra_env={**stack.cfg.extra_env, **env, DIR_ENV: str(folder)},
                            process_env={**stack.cfg.process_env, **process_env})
        stacks[name] = (stack, folder)
    results: dict = {"args": vars(args), "variants": {}}
    traced: dict[tuple[str, str], tuple[range, int]] = {}  # (variant, cell) -> (its plans' steps, depth)
    roles = ["verifier", *(f"verifier-tp{r}" for r in range(1, args.tp_size))] + ([] if colocated else ["draft"])
    try:
        for stack, _ in stacks.values():
            stack.start_verifier()
            if not colocated:
                stack.start_draft()
            stack.start_manager()
        for stack, _ in stacks.values():
            stack.wait_ready(600)
        log("stacks ready")
        for name, (stack, folder) in stacks.items():
            found = results["variants"][name] = {}
            depths = [int(d) for d in args.depths.split(",")]
            for i, (k, m) in enumerate(args.points):
                if colocated:
                    cells = [("SD colocated", "sd", prompts[:m], d) for d in depths] if args.colocated_sd else []
                    cells += [("AR", "ar", prompts[:m], d) for d in depths]
                else:
                    cells = [("SD-2GPU", "sd", prompts[:m], 2)]
                    cells += [(f"PSD m+m depth {d}", "psd", prompts[: 2 * m], d) for d in depths]
                for config, mode, batch, depth in cells:
                    first_step = fetch_status(stack.cfg.http_port)["step"]
                    row, _ = measure(stack, mode, k, batch, args.max_tokens, args.reps, depth)
                    last_step = fetch_status(stack.cfg.http_port)["step"]
                    traced[(name, f"k={k} m={m} {config}")] = (range(first_step, last_step), depth)
                    log(f"{name} k={k} m={m} {config}: {row['tokens_per_s']:.0f} tok/s, step {row['step_ms']:.2f} "
                        f"ms, draft {row['draft_ms_per_batch']:.2f} / verify {row['verify_ms_per_batch']:.2f} per "
                        f"batch, overlap {row['overlap_efficiency']:.2f}, "
                        f"plan queued {row['verify_plan_queued_ms']:.2f} ms")
                    cell = found[f"k={k} m={m} {config}"] = {"row": row}
                    if i == 0 and args.steps > 0 and depth == depths[0]:
                        cell["profile"] = profile_run(stack, folder, mode, batch, args, roles)
                    (out / "probe.json").write_text(json.dumps(results, indent=1))
    finally:
        for stack, _ in stacks.values():
            stack.stop(grace=20)
    if args.control_trace:  # the processes write their last marks as they exit
        for (name, cell), (steps, depth) in traced.items():
            marks = control_trace_report.load(stacks[name][1] / "control_trace")
            parts = control_trace_report.breakdown(marks, depth, steps=steps)
            log(f"{name} {cell} depth {depth}: a plan's round trip\n{control_trace_report.render(parts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
