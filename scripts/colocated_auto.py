"""Adaptive k (auto) against every fixed k on a colocated verifier (fused SD), one GPU, 8B-shaped synthetic pair;
with --psd, PSD m+m on two GPUs instead (the draft service on GPU 1, 2m requests for two batches of m).

Usage (repository root, a CUDA machine):
    python3 scripts/colocated_auto.py ACCEPTANCES MS KS [--tokens N] [--rounds R] [--capture-k K] [--workloads W]
                                      [--psd] [--control K]
e.g.   python3 scripts/colocated_auto.py 0.7,0.5,0.9 16,64 1,2,3,4,5,6 --tokens 256 --rounds 2
       python3 scripts/colocated_auto.py 0.7,0.9 32 2,3,4,5,6 --tokens 256 --rounds 3 --psd --control 6
Runs of identical choices came out up to 4% apart in one call (docs/benchmarks/gpu.md, adaptive k):
--control K times k = K twice per round (the second mid-round) and reports the ratio of the two, the floor
under which auto / best fixed says nothing.
For each acceptance level it starts one colocated stack whose workers capture every CUDA graph auto may
need at start-up (--capture-k, default max(KS); 0 = on first use), then, per batch size m and workload,
times SD at each fixed k and auto (k <= max(KS)) in R rounds (the order reversed every other round, so a
drift of the machine hits every configuration alike). Workloads (--workloads, default uniform,draining):
"uniform" (m requests of N tokens), "draining" (m requests of 32..2N-32 tokens, mean N: the batch shrinks as
they end, so the best k moves) and "queued" (4m such requests for a batch of m: an ended request's place
is taken by a waiting one until the last m drain, closest to serving).
One JSON line per (acceptance, m, workload): tokens/s per round, the median per configuration, the best
fixed k by median, auto's ratio to it, the k auto chose, the graph-capture ms inside timed runs (must be
0: no capture in a timed run), what auto learnt, and whether every configuration's output was identical.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys

from minedraft.bench.client import fetch_status, generate_all, put_policy
from minedraft.bench.gpu.placements import PairSpecs, colocated_stack, measure, split_stack
from minedraft.bench.peaked_head import agree_for_acceptance
from minedraft.bench.synthetic_pair import SyntheticSpec
from minedraft.bench.workload import random_prompts


def spread(count: int, tokens: int) -> list[int]:
    """Lengths 32..2N-32 (mean N), long and short interleaved."""
    lengths = [32 + (2 * tokens - 64) * i // max(count - 1, 1) for i in range(count)]
    return lengths[::2] + lengths[1::2]


def workloads(m: int, tokens: int) -> dict[str, list[int]]:
    """name -> each request's length, all sent at once to a batch of m."""
    return {"uniform": [tokens] * m, "draining": spread(m, tokens), "queued": spread(4 * m, tokens)}


def timed(stack, mode: str, k: int, prompts: list[list[int]], lengths: list[int], m: int) -> dict:
    row, out = measure(stack, mode, k, prompts[:len(lengths)], lengths, 1, max_num_seqs=m)
    return {"rate": round(row["tokens_per_s"], 1), "out": out, "captured_ms": round(row["graph_capture_ms"], 1),
            "plans_by_k": row["plans_by_k"], "plans_for_the_end": row["plans_for_the_end"],
            # per verify step of the timed run: what the model predicts against what happened
            "steps": row["steps"], "step_ms": round(row["step_ms"], 3), "verify_ms": round(row["verify_ms"], 3),
            "mean_accepted_length": round(row["mean_accepted_length"], 3)}


def run_level(acceptance: float, ms: list[int], fixed: list[int], args: argparse.Namespace,
              prompts: list[list[int]]) -> None:
    target, draft = SyntheticSpec("llama3-8b", "target", 0.02, 4, agree_for_acceptance(acceptance)).pair()
    capture_k = max(fixed) if args.capture_k is None else args.capture_k
    pair, batches = PairSpecs(str(target), str(draft)), 2 if args.psd else 1  # PSD m+m: two batches of m
    place = split_stack if args.psd else colocated_stack
    stack = place(pair, 4096, batches * max(ms), capture_k=capture_k)
    stack.start_verifier()
    if args.psd:
        stack.start_draft()
    stack.start_manager()
    stack.wait_ready(900)
    fixed_mode = "psd" if args.psd else "sd"
    try:
        for m in ms:  # Triton autotuning and the first allocations, outside every timed run
            for k in range(1, max(fixed) + 1):
                put_policy(stack.admin_port, mode=fixed_mode, k=k, max_num_seqs=batches * m)
                asyncio.run(generate_all(stack.cfg.grpc_port, prompts[:batches * m], 32))
        configs = [*((f"k={k}", fixed_mode, k) for k in fixed), ("auto", "auto", max(fixed))]
        if args.control:  # the same fixed k once more: how far apart two runs of identical choices come out
            configs.insert(len(configs) // 2, ("control", fixed_mode, args.control))
        for m in ms:
            for name, lengths in workloads(batches * m, args.tokens).items():
                if name not in args.workloads.split(","):
                    continue
                runs: dict[str, list[dict]] = {}
                for r in range(args.rounds):
                    for label, mode, k in configs if r % 2 == 0 else configs[::-1]:
                        runs.setdefault(label, []).append(timed(stack, mode, k, prompts, lengths, batches * m))
                median = {label: statistics.median(x["rate"] for x in rs) for label, rs in runs.items()}
                best = max((label for label in median if label not in ("auto", "control")), key=median.__getitem__)
                status = fetch_status(stack.cfg.http_port).get("adaptive_k") or {}
                print(json.dumps({
                    "acceptance": acceptance, "m": m, "placement": "PSD m+m" if args.psd else "SD colocated (fused)",
                    "workload": name, "tokens": args.tokens,
                    "tokens_per_s": {label: [x["rate"] for x in rs] for label, rs in runs.items()},
                    "median": median, "best_fixed": best,
                    "auto_over_best_median": round(median["auto"] / median[best], 3),
                    "control_over_same_k": (round(median["control"] / median[f"k={args.control}"], 3)
                                            if args.control else None),
                    "auto_over_best_max": round(max(x["rate"] for x in runs["auto"])
                                                / max(x["rate"] for x in runs[best]), 3),
                    "auto_k": [x["plans_by_k"] for x in runs["auto"]],
                    "auto_plans_for_the_end": [x["plans_for_the_end"] for x in runs["auto"]],
                    "per_step": {label: [{key: x[key] for key in ("steps", "step_ms", "verify_ms",
                                                                  "mean_accepted_length")} for x in rs]
                                 for label, rs in runs.items()},
                    "captured_ms_in_timed_runs": sum(x["captured_ms"] for rs in runs.values() for x in rs),
                    "learnt": {"acceptance_by_position": status.get("acceptance_by_position"),
                               "draft_ms_by_batch_and_k": status.get("draft_ms_by_batch_and_k"),
                               "verify_ms_by_tokens": status.get("verify_ms_by_tokens")},
                    "outputs_identical": len({json.dumps(x["out"]) for rs in runs.values() for x in rs}) == 1,
                }), flush=True)
    finally:
        stack.stop(grace=20)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("acceptances")
    parser.add_argument("ms")
    parser.add_argument("ks")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--capture-k", type=int, default=None)
    parser.add_argument("--workloads", default="uniform,draining", help="any of uniform, draining, queued")
    parser.add_argument("--psd", action="store_true", help="PSD m+m on GPUs 0 and 1 instead of SD colocated")
    parser.add_argument("--control", type=int, default=0,
                        help="also time this fixed k (one of KS) a second time, mid-round: the noise floor of a ratio")
    args = parser.parse_args(argv)
    if args.control and str(args.control) not in args.ks.split(","):
        parser.error("--control must be one of KS")
    ms, fixed = [int(x) for x in args.ms.split(",")], [int(x) for x in args.ks.split(",")]
    prompts = random_prompts(8 * max(ms), seed=13)
    for acceptance in (float(x) for x in args.acceptances.split(",")):
        run_level(acceptance, ms, fixed, args, prompts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
