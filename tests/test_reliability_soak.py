"""The three real processes on a tiny KV cache: preemption keeps greedy output exact, a gRPC
deadline frees everything, and a soak with 20% cancels and kill -9 faults ends with every
completed answer exact, every KV block free and no process left behind. Half the soak's prompts
open with one of a few shared prefixes and are long enough to be chunked (a 32-token budget), so
prefix-cache hits, evictions from a full cache and chunked prefill all meet cancels, preemption
and restarted workers (which start with an empty cache).

The soak lasts MINEDRAFT_SOAK_S seconds (20 in CI); the longer run is a benchmark:
`MINEDRAFT_SOAK_S=300 .venv/bin/pytest tests/test_reliability_soak.py -s` (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import psutil
import pytest

from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.proto import generation_pb2, generation_pb2_grpc
from tests.conftest import wait_until, worker_info
from tests.reliability_support import reference

SOAK_S = float(os.environ.get("MINEDRAFT_SOAK_S", "20"))
NUM_BLOCKS = 48  # 768 tokens of KV for the whole stack: a handful of requests fill it
CLIENTS = 6


class Supervised:
    """The stack plus a thread that does what `minedraft serve` does: reap and restart children."""

    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        self.pids: set[int] = set()  # every process the stack ever ran
        self.events: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.events += self.stack.supervise()
            self.pids |= {p.pid for p in self.stack.procs.values()}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def health(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.stack.cfg.http_port}/health", timeout=5).json()

    def recovered(self) -> bool:
        try:
            status = self.health()
        except httpx.TransportError:
            return False
        return status["status"] == "ok" and status["draft_state"] == "drafting" and status["running"] == 0


@pytest.fixture(scope="module")
def supervised(random_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    cfg = StackConfig(target=str(random_pair[0]), draft=str(random_pair[1]), grpc_port=free_port(),
                      http_port=free_port(), k=3, num_blocks=NUM_BLOCKS, log_dir=tmp_path_factory.mktemp("soak"),
                      max_num_batched_tokens=32)
    stack = LocalStack(cfg)
    stack.start(timeout=120)
    s = Supervised(stack)
    yield s
    s.close()
    stack.stop()


async def grpc_run(port: int, prompt: list[int], max_tokens: int, cancel_after: int | None = None) -> list[int]:
    """Greedy tokens of one streamed request; with `cancel_after`, the client leaves after that many chunks."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        request = generation_pb2.GenerateRequest(
            token_ids=generation_pb2.TokenIds(ids=prompt),
            sampling=generation_pb2.SamplingParameters(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
        call = stub.GenerateStream(request, timeout=120)
        tokens: list[int] = []
        async for chunk in call:
            tokens.extend(chunk.token_ids)
            if cancel_after is not None and len(tokens) >= cancel_after:
                call.cancel()
                break
        return tokens


async def http_run(port: int, prompt: list[int], max_tokens: int, cancel_after: int | None = None) -> list[int]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    text = ""
    async with httpx.AsyncClient(timeout=120) as client, client.stream(
            "POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as reply:
        if reply.status_code != 200:
            raise ConnectionError(f"HTTP {reply.status_code}")
        async for line in reply.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                if "error" in event:
                    raise ConnectionError(event["error"]["message"])
                text += event["choices"][0]["text"]
                if cancel_after is not None and len(text.split()) >= cancel_after:
                    break  # leaving the block closes the connection: the server aborts the request
    return [int(w[1:]) for w in text.split()]


def test_preemption_on_a_tiny_cache_keeps_greedy_output_exact(supervised: Supervised, random_pair) -> None:
    prompts = [[3 + i, 40, 41 + i, 42] for i in range(10)]
    expected = reference(random_pair, prompts, [120] * 10)
    before = supervised.health()["preemptions"]

    async def run_all() -> list[list[int]]:
        return await asyncio.gather(*(grpc_run(supervised.stack.cfg.grpc_port, p, 120) for p in prompts))

    assert asyncio.run(run_all()) == expected
    assert supervised.health()["preemptions"] > before, "10 requests of 124 tokens cannot share 768 tokens of KV"


def test_a_grpc_deadline_aborts_the_request_and_frees_its_blocks(supervised: Supervised) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{supervised.stack.cfg.grpc_port}") as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        request = generation_pb2.GenerateRequest(
            token_ids=generation_pb2.TokenIds(ids=[5, 6, 7]),
            sampling=generation_pb2.SamplingParameters(max_tokens=240, temperature=0.0, ignore_eos=True))
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(request, timeout=0.05)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(lambda: supervised.health()["running"] == 0, timeout=10)
    for port in (supervised.stack.target_port, supervised.stack.draft_port):
        wait_until(lambda port=port: worker_info(port).free_blocks == NUM_BLOCKS, timeout=10)


def test_soak_with_cancels_and_faults_ends_exact_with_every_block_free_and_no_process_left(
        supervised: Supervised, random_pair) -> None:
    stack = supervised.stack
    rng = random.Random(12)
    end = time.monotonic() + SOAK_S
    completed: list[tuple[list[int], int, list[int]]] = []
    counts = {"completed": 0, "cancelled": 0, "failed": 0}
    prefixes = [[rng.randrange(2, 90) for _ in range(rng.randint(40, 90))] for _ in range(3)]

    async def client(cid: int) -> None:
        run = grpc_run if cid % 2 else http_run
        port = stack.cfg.grpc_port if cid % 2 else stack.cfg.http_port
        while time.monotonic() < end:
            prompt = [rng.randrange(2, 90) for _ in range(rng.randint(2, 12))]
            if rng.random() < 0.5:
                prompt = rng.choice(prefixes) + prompt
            max_tokens = rng.randint(4, 80)
            cancel_after = rng.randint(1, 3) if rng.random() < 0.2 else None
            try:
                tokens = await run(port, prompt, max_tokens, cancel_after)
            except (grpc.aio.AioRpcError, ConnectionError, httpx.HTTPError):
                counts["failed"] += 1  # on a verifier that died, or while it restarts
                await asyncio.sleep(0.1)
                continue
            if cancel_after is None:
                completed.append((prompt, max_tokens, tokens))
                counts["completed"] += 1
            else:
                counts["cancelled"] += 1

    async def faults() -> None:
        victims = itertools.cycle(["draft", "verifier"])
        every = max(4.0, SOAK_S / 4)
        while time.monotonic() + every < end:
            await asyncio.sleep(every)
            victim = stack.procs.get(next(victims))
            if victim is not None:
                os.kill(victim.pid, signal.SIGKILL)

    async def soak() -> None:
        await asyncio.gather(faults(), *(client(i) for i in range(CLIENTS)))

    asyncio.run(soak())
    wait_until(supervised.recovered, timeout=60)
    expected = reference(random_pair, [p for p, _, _ in completed], [m for _, m, _ in completed])
    assert [t for _, _, t in completed] == expected
    assert counts["completed"] >= 20 and counts["cancelled"] >= 2, counts
    assert sum("restarting" in e for e in supervised.events) >= min(2, int(SOAK_S // 4) - 1), supervised.events
    for port in (stack.target_port, stack.draft_port):
        wait_until(lambda port=port: worker_info(port).free_blocks == NUM_BLOCKS, timeout=10)
        assert worker_info(port).sequences == 0
    status = supervised.health()
    cache = status["prefix_cache"]
    assert cache["target"]["hits"] > 0 and cache["draft"]["hits"] > 0 and cache["target"]["prefill_tokens"] > 0, cache
    supervised.close()
    codes = stack.stop()
    assert codes == {"verifier": 0, "draft": 0, "batch-manager": 0}, codes
    left = [pid for pid in supervised.pids if psutil.pid_exists(pid)]
    assert not left, f"processes left behind: {left}"
    print(f"soak {SOAK_S:.0f} s: {counts}, faults {[e for e in supervised.events if 'exited' in e]}, "
          f"preemptions {status['preemptions']}, verifier reconnects {status['verifier_reconnects']}")
