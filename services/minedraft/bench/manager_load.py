"""`python -m minedraft.bench.manager_load`: the batch manager's own CPU per generated token.

The batch manager is one Python process (one event loop) for the whole deployment, so its CPU per
token caps tokens/s whatever the GPUs do. Here a stand-in verifier (a gRPC worker whose step is a
timed wait that leaves the interpreter free, as a GPU step does, and gives every sequence one token)
drives the real `minedraft batch-manager` process, and clients in this process keep `--batch`
requests running: unary gRPC calls, gRPC streams (`--stream`) or OpenAI HTTP streams (`--http`).
The manager's CPU time (user + system, from /proc) over each timed run, divided by the tokens it
returned, is what a token costs it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import subprocess
import sys
import time
from pathlib import Path

from minedraft.bench.client import fetch_status, generate_all
from minedraft.bench.workload import random_prompts
from minedraft.bundled import TINY_TARGET
from minedraft.cli.local_stack import free_port
from minedraft.proto import control_pb2

VOCAB = 4096


class WaitingVerifier:
    """Every plan: wait `step_s` (interpreter free), then one token for each sequence it verifies."""

    role = "verifier"

    def __init__(self, step_s: float) -> None:
        import torch  # the worker side only; the measuring process never needs it

        self.device = torch.device("cpu")
        self.step_s = step_s

    def reset(self) -> None:
        pass

    def info(self) -> control_pb2.WorkerInfo:
        return control_pb2.WorkerInfo(role="verifier", vocab_size=VOCAB, max_context=8192, num_blocks=1 << 20,
                                      block_size=16, eos_token_ids=[1], device="cpu")

    def handle_setup(self, setup: control_pb2.DataPlaneSetup) -> control_pb2.WorkerEvent:
        return control_pb2.WorkerEvent(step=-1, setup_done=True)

    def graph_capture_ms(self) -> float:
        return 0.0

    def handle_plan(self, plan: control_pb2.StepPlan) -> control_pb2.WorkerEvent:
        time.sleep(self.step_s)
        event = control_pb2.WorkerEvent(step=plan.step)
        ids = list(plan.verify_batch)
        event.verdicts.seq_ids.extend(ids)
        event.verdicts.counts.extend([1] * len(ids))
        event.verdicts.accepted.extend([0] * len(ids))
        event.verdicts.tokens.extend((plan.step * 7 + i) % (VOCAB - 16) + 16 for i in range(len(ids)))
        event.timing.batch = len(ids)
        return event


def serve_verifier(port: int, step_ms: float) -> None:
    from minedraft.worker.server import serve_worker

    serve_worker(WaitingVerifier(step_ms / 1000.0), "127.0.0.1", port).server.wait_for_termination()


def cpu_seconds(pid: int) -> float:
    """On-CPU time of the process's threads, to the nanosecond (/proc/<pid>/task/*/schedstat): /proc/<pid>/stat
    counts 10 ms ticks, and a short run of unary calls costs the manager a few ms in all."""
    total_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total_ns += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            continue
    return total_ns / 1e9


async def sse_all(port: int, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    """`generate_all` over the OpenAI HTTP API, streamed (server-sent events); the usage counts the tokens."""
    import httpx  # a dev dependency: only this mode needs it

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:

        async def one(prompt: list[int]) -> list[int]:
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}}
            tokens = 0
            async with client.stream("POST", "/v1/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        usage = json.loads(line[6:]).get("usage")
                        tokens = usage["completion_tokens"] if usage else tokens
            return [0] * tokens

        start = time.perf_counter()
        outputs = await asyncio.gather(*(one(p) for p in prompts))
        return list(outputs), time.perf_counter() - start


def wait_for_manager(http_port: int, manager: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if manager.poll() is not None:
            raise RuntimeError(f"the batch manager exited with {manager.returncode}")
        try:
            if fetch_status(http_port)["status"] == "ok":
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the batch manager did not become ready")


def measure(args: argparse.Namespace) -> list[dict]:
    worker_port, grpc_port, http_port = free_port(), free_port(), free_port()
    worker = subprocess.Popen([sys.executable, "-m", "minedraft.bench.manager_load", "--serve-verifier",
                               str(worker_port), "--step-ms", str(args.step_ms)])
    manager = subprocess.Popen(
        [sys.executable, "-m", "minedraft.cli.main", "batch-manager", "--tokenizer", str(TINY_TARGET),
         "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--admin-port", str(free_port()),
         "--mode", "ar", "--max-num-seqs", str(args.batch), "--verifier-address", f"127.0.0.1:{worker_port}",
         "--draft-address", "", "--stream-interval", str(args.stream_interval)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = sse_all if args.http else functools.partial(generate_all, stream=args.stream)
    client_port = http_port if args.http else grpc_port
    rows = []
    try:
        wait_for_manager(http_port, manager)
        prompts = random_prompts(args.batch, seed=1)
        asyncio.run(run(client_port, prompts, min(args.max_tokens, 32)))  # connections, first compiles
        for _ in range(args.repeats):
            cpu0, step0 = cpu_seconds(manager.pid), fetch_status(http_port)["step"]
            outputs, seconds = asyncio.run(run(client_port, prompts, args.max_tokens))
            cpu, steps = cpu_seconds(manager.pid) - cpu0, fetch_status(http_port)["step"] - step0
            tokens = sum(len(o) for o in outputs)
            rows.append({"batch": args.batch, "client": "http-sse" if args.http else "grpc-stream" if args.stream
                         else "grpc-unary", "stream_interval": args.stream_interval,
                         "tokens": tokens,
                         "tokens_per_s": round(tokens / seconds, 1), "cpu_us_per_token": round(cpu / tokens * 1e6, 2),
                         "cpu_ms_per_step": round(cpu / max(steps, 1) * 1e3, 3),
                         "ms_per_step": round(seconds / max(steps, 1) * 1e3, 3)})
    finally:
        manager.terminate()
        worker.kill()
        try:
            manager.wait(20)
        except subprocess.TimeoutExpired:
            manager.kill()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minedraft.bench.manager_load", description=__doc__)
    p.add_argument("--batch", type=int, default=64, help="requests running at once")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--step-ms", type=float, default=4.0, help="the stand-in verifier's step")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--stream", action="store_true", help="GenerateStream clients instead of unary Generate")
    p.add_argument("--http", action="store_true", help="streaming OpenAI /v1/completions clients (needs httpx)")
    p.add_argument("--stream-interval", type=int, default=1, help="the manager's --stream-interval")
    p.add_argument("--json-out", type=Path)
    p.add_argument("--serve-verifier", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_verifier:
        serve_verifier(args.serve_verifier, args.step_ms)
        return 0
    rows = measure(args)
    for row in rows:
        print(json.dumps(row))
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
