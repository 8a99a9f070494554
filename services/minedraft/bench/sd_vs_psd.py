"""Standard SD vs batch-parallel SD through the real three services (`minedraft bench psd`).

Each configuration gets a fresh local stack (verifier and draft service pinned to their
own core, one torch thread each) and the same greedy workload; configurations alternate
over several rounds so machine noise hits all of them alike, and ratios are taken from
medians measured in this one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from minedraft.bench.client import fetch_status, run_workload, step_delta
from minedraft.bench.workload import code_prompts
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.core.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Setup:
    name: str
    mode: str
    concurrency: int


def measure(args: argparse.Namespace, setup: Setup, prompts: list[list[int]],
            process_env: dict[str, dict[str, str]] | None = None) -> dict[str, float]:
    """One fresh stack, warmed up, then the timed workload; `process_env` adds variables per process."""
    cfg = StackConfig(target=args.target, draft=args.draft, grpc_port=free_port(), http_port=free_port(),
                      mode=setup.mode, k=args.k, threads=1, max_num_seqs=setup.concurrency,
                      target_cpu=args.target_cpu, draft_cpu=args.draft_cpu, process_env=process_env or {})
    stack = LocalStack(cfg)
    try:
        stack.start()
        run_workload(cfg.grpc_port, prompts[:2], 8)  # warm-up
        before = fetch_status(cfg.http_port)
        tokens, seconds = run_workload(cfg.grpc_port, prompts[: setup.concurrency], args.max_tokens)
        result = step_delta(fetch_status(cfg.http_port), before)
    finally:
        stack.stop()
    result.update(tokens_per_s=tokens / seconds, seconds=seconds, generated=tokens)
    return result


def summarize(setup: Setup, runs: list[dict[str, float]]) -> dict[str, float | str]:
    """Per-round anatomy: a round is the time in which every running request advances once.

    SD alternates draft-only and verify-only steps, so its per-step averages are halves of
    the real draft and verify times; PSD runs one draft and one verify in every step.
    """
    med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    round_ms = 2 * med["wall_ms"]
    if setup.mode == "sd":
        draft, verify = 2 * med.get("draft_compute_ms", 0.0), 2 * med.get("verify_compute_ms", 0.0)
        ideal = draft + verify
    else:
        draft, verify = med.get("draft_compute_ms", 0.0), med.get("verify_compute_ms", 0.0)
        ideal = 2 * max(draft, verify)
    return {
        "config": setup.name,
        "tokens_per_s": round(med["tokens_per_s"], 1),
        "acceptance": round(med["acceptance"], 3),
        "tokens_per_seq_step": round(med["mean_accepted_length"], 2),
        "round_ms": round(round_ms, 2),
        "draft_ms": round(draft, 2),
        "verify_ms": round(verify, 2),
        "round_over_ideal": round(round_ms / ideal, 3) if ideal else 0.0,
        "data_plane_ms": round(med.get("verify_send_ms", 0.0) + med.get("draft_send_ms", 0.0), 3),
        "control_ms": round(med.get("verify_control_ms", 0.0) + med.get("draft_control_ms", 0.0), 3),
        "overhead_share": round(1 - ideal / round_ms, 3) if round_ms else 0.0,
    }


def run(args: argparse.Namespace) -> int:
    m = args.concurrency
    setups = [Setup(f"SD m={m}", "sd", m), Setup(f"PSD m/2+m/2={m}", "psd", m), Setup(f"PSD m+m={2 * m}", "psd", 2 * m)]
    prompts = code_prompts(Tokenizer(args.target), 2 * m, 32)
    raw: dict[str, list[dict[str, float]]] = {s.name: [] for s in setups}
    for _ in range(args.rounds):
        for setup in setups:
            raw[setup.name].append(measure(args, setup, prompts))
    rows = [summarize(s, raw[s.name]) for s in setups]
    base = rows[0]["tokens_per_s"]
    print(f"k={args.k}, max_tokens={args.max_tokens}, verifier on CPU {args.target_cpu}, draft on CPU "
          f"{args.draft_cpu}, one torch thread each; medians of {args.rounds} alternating rounds")
    print("| config | tok/s | vs SD | acceptance | tokens/seq-step | round ms | draft ms | verify ms | "
          "round/ideal | data-plane ms/step | control ms/step | overhead share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['tokens_per_s']} | {r['tokens_per_s'] / base:.2f}x | {r['acceptance']} | "
              f"{r['tokens_per_seq_step']} | {r['round_ms']} | {r['draft_ms']} | {r['verify_ms']} | "
              f"{r['round_over_ideal']} | {r['data_plane_ms']} | {r['control_ms']} | {r['overhead_share']} |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": rows, "raw": raw}, indent=2))
    return 0
