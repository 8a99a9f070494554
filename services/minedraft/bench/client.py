"""Talking to a running batch manager: greedy gRPC workloads, /health snapshots, live policy."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Sequence

import grpc

from minedraft.proto import generation_pb2, generation_pb2_grpc


def fetch_status(port: int, host: str = "127.0.0.1") -> dict:
    """GET /health of a batch manager: its counters and per-step timing totals."""
    with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=5) as r:
        return json.loads(r.read())


def put_policy(admin_port: int, host: str = "127.0.0.1", **policy: object) -> dict:
    """PUT /admin/policy on a batch manager's admin port (it drains in-flight steps before answering)."""
    req = urllib.request.Request(f"http://{host}:{admin_port}/admin/policy", json.dumps(policy).encode(),
                                 {"Content-Type": "application/json"}, method="PUT")
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def greedy_request(prompt: list[int], max_tokens: int) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=prompt),
        sampling=generation_pb2.SamplingParameters(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


async def one_request(stub: generation_pb2_grpc.GenerationStub, prompt: list[int], max_tokens: int) -> list[int]:
    """Unary greedy call: an offline batch, as the paper measures; no per-token streaming cost."""
    response = await stub.Generate(greedy_request(prompt, max_tokens), timeout=600)
    return list(response.token_ids)


async def one_stream(stub: generation_pb2_grpc.GenerationStub, prompt: list[int], max_tokens: int) -> list[int]:
    """Streamed greedy call: a chunk per verdict (or per --stream-interval tokens) reaches the client."""
    return [t async for chunk in stub.GenerateStream(greedy_request(prompt, max_tokens), timeout=600)
            for t in chunk.token_ids]


async def generate_all(grpc_port: int, prompts: list[list[int]], max_tokens: int | Sequence[int],
                       host: str = "127.0.0.1", stream: bool = False) -> tuple[list[list[int]], float]:
    """Every prompt at once (unary calls, or streams); returns the output ids and the wall time of the set.
    `max_tokens`: one length for all, or one per prompt (a batch that drains as its requests end)."""
    call = one_stream if stream else one_request
    lengths = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    async with grpc.aio.insecure_channel(f"{host}:{grpc_port}") as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        start = time.perf_counter()
        outputs = await asyncio.gather(*(call(stub, p, n) for p, n in zip(prompts, lengths, strict=True)))
        return list(outputs), time.perf_counter() - start


def run_workload(grpc_port: int, prompts: list[list[int]], max_tokens: int) -> tuple[int, float]:
    """Generate for every prompt at once; returns (tokens generated, wall seconds)."""
    outputs, seconds = asyncio.run(generate_all(grpc_port, prompts, max_tokens))
    return sum(len(o) for o in outputs), seconds


def step_delta(after: dict, before: dict) -> dict[str, float]:
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


def plans_delta(after: dict, before: dict) -> dict[str, object]:
    """Adaptive k's plans between two /health snapshots: how many drafted each k, how many were chosen for the end."""
    a, b = after.get("adaptive_k") or {}, before.get("adaptive_k") or {}
    by_k = {k: n - b.get("plans_by_k", {}).get(k, 0) for k, n in a.get("plans_by_k", {}).items()}
    return {"plans_by_k": {k: n for k, n in by_k.items() if n > 0},
            "plans_for_the_end": a.get("plans_for_the_end", 0) - b.get("plans_for_the_end", 0)}
