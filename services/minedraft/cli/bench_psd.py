"""`minedraft bench-psd`: standard SD vs batch-parallel SD through the real three services.

Each configuration gets a fresh local stack (verifier and draft service pinned to their
own core, one torch thread each) and the same greedy workload; configurations alternate
over several rounds so machine noise hits all of them alike, and ratios are taken from
medians measured in this one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc

from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.cli.bench import benchmark_prompts_from_tokenizer
from minedraft.cli.stack import LocalStack, StackConfig, free_port
from minedraft.core.tokenizer import Tokenizer
from minedraft.proto import generation_pb2, generation_pb2_grpc


@dataclass(frozen=True, slots=True)
class Setup:
    name: str
    mode: str
    concurrency: int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-psd", help="standard SD vs PSD through the three services")
    p.add_argument("--target", default=str(TINY_TARGET))
    p.add_argument("--draft", default=str(TINY_DRAFT))
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=16, help="total concurrency m (PSD: m/2 + m/2)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--target-cpu", default="0")
    p.add_argument("--draft-cpu", default="1")
    p.add_argument("--json-out", help="write raw results here")
    p.set_defaults(run=run)


def fetch_status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        return json.loads(r.read())


def put_policy(port: int, **policy: object) -> dict:
    """PUT /admin/policy on a local batch manager (it drains before answering)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/admin/policy", json.dumps(policy).encode(),
                                 {"Content-Type": "application/json"}, method="PUT")
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


async def one_request(stub: generation_pb2_grpc.GenerationStub, prompt: list[int], max_tokens: int) -> list[int]:
    """Unary greedy call: an offline batch, as the paper measures; no per-token streaming cost."""
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=prompt),
        sampling=generation_pb2.SamplingParameters(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )
    response = await stub.Generate(request, timeout=600)
    return list(response.token_ids)


async def generate_all(grpc_port: int, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    """Every prompt at once; returns the output ids and the wall time of the whole set."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        start = time.perf_counter()
        outputs = await asyncio.gather(*(one_request(stub, p, max_tokens) for p in prompts))
        return list(outputs), time.perf_counter() - start


async def run_workload(grpc_port: int, prompts: list[list[int]], max_tokens: int) -> tuple[int, float]:
    outputs, seconds = await generate_all(grpc_port, prompts, max_tokens)
    return sum(len(o) for o in outputs), seconds


def delta(after: dict, before: dict) -> dict[str, float]:
    """Per-step anatomy and the speculation ratios of what ran between two /health snapshots."""
    a, b = after["timing_totals"], before["timing_totals"]
    steps = a.get("steps", 0) - b.get("steps", 0)
    out = {key: (a.get(key, 0.0) - b.get(key, 0.0)) / max(steps, 1) for key in a if key != "steps"}
    out["steps"] = steps
    grew = {key: after[key] - before[key] for key in ("tokens_total", "drafted_total", "accepted_total",
                                                         "seq_verifies_total")}
    out["tokens"] = grew["tokens_total"]
    out["acceptance"] = grew["accepted_total"] / grew["drafted_total"] if grew["drafted_total"] else 0.0
    out["mean_accepted_length"] = (grew["tokens_total"] / grew["seq_verifies_total"]
                                   if grew["seq_verifies_total"] else 0.0)
    return out


def measure(args: argparse.Namespace, setup: Setup, prompts: list[list[int]]) -> dict[str, float]:
    cfg = StackConfig(target=args.target, draft=args.draft, grpc_port=free_port(), http_port=free_port(),
                      mode=setup.mode, k=args.k, threads=1, max_num_seqs=setup.concurrency,
                      target_cpu=args.target_cpu, draft_cpu=args.draft_cpu)
    stack = LocalStack(cfg)
    try:
        stack.start()
        asyncio.run(run_workload(cfg.grpc_port, prompts[:2], 8))  # warm-up
        before = fetch_status(cfg.http_port)
        tokens, seconds = asyncio.run(run_workload(cfg.grpc_port, prompts[: setup.concurrency], args.max_tokens))
        result = delta(fetch_status(cfg.http_port), before)
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
    prompts = benchmark_prompts_from_tokenizer(Tokenizer(args.target), 2 * m, 32)
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
