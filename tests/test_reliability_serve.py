"""`minedraft serve` under faults, as a user runs it: kill -9 of the draft service (exact tokens,
it comes back, PSD resumes), kill -9 of the verifier (clear errors, it comes back, service
resumes), then SIGTERM with 8 streams in flight (all finish, every process exits 0)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import psutil
import pytest

from minedraft.cli.local_stack import free_port
from minedraft.proto import generation_pb2, generation_pb2_grpc
from tests.conftest import wait_until
from tests.reliability_support import reference

DRAIN_GRACE_S = 20


@dataclass
class Served:
    proc: subprocess.Popen
    http: str
    grpc_port: int
    log: Path

    def child(self, role: str) -> psutil.Process:
        """The live child process running `minedraft <role>`."""
        for child in psutil.Process(self.proc.pid).children():
            cmd = child.cmdline()
            if role in cmd and child.status() != psutil.STATUS_ZOMBIE:
                return child
        raise AssertionError(f"no live {role} child")

    def health(self) -> tuple[int, dict]:
        reply = httpx.get(f"{self.http}/health", timeout=5)
        return reply.status_code, reply.json()

    def back(self) -> bool:
        """Serving again with the draft service in the loop."""
        code, status = self.health()
        return code == 200 and status["status"] == "ok" and status["draft_state"] == "drafting"


@pytest.fixture(scope="module")
def served(random_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    http_port, grpc_port = free_port(), free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "minedraft.cli.main", "serve", "--target", str(random_pair[0]), "--draft",
             str(random_pair[1]), "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--admin-port",
             str(free_port()), "--k", "3", "--drain-grace-s", str(DRAIN_GRACE_S)],
            stdout=out, stderr=subprocess.STDOUT)
    s = Served(proc, f"http://127.0.0.1:{http_port}", grpc_port, log)

    def ready() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            return s.health()[0] == 200
        except httpx.TransportError:
            return False

    wait_until(ready, timeout=120)
    yield s
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


async def grpc_run(port: int, prompt: list[int], max_tokens: int) -> tuple[list[int], str]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        request = generation_pb2.GenerateRequest(
            token_ids=generation_pb2.TokenIds(ids=prompt),
            sampling=generation_pb2.SamplingParameters(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
        tokens, reason = [], ""
        async for chunk in stub.GenerateStream(request, timeout=120):
            tokens.extend(chunk.token_ids)
            reason = chunk.finish_reason or reason
        return tokens, reason


async def http_run(base: str, prompt: list[int], max_tokens: int, started: asyncio.Event | None = None
                   ) -> tuple[list[int], str]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    text, reason = "", ""
    async with httpx.AsyncClient(timeout=120) as client, client.stream("POST", f"{base}/v1/completions",
                                                                       json=body) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                reason = choice["finish_reason"] or reason
                if started is not None and text:
                    started.set()
    return [int(w[1:]) for w in text.split()], reason


def wait_for_steps(served: Served, steps: int) -> None:
    start = served.health()[1]["step"]
    wait_until(lambda: served.health()[1]["step"] >= start + steps, timeout=60)


def test_kill_9_of_the_draft_keeps_tokens_exact_and_the_launcher_brings_it_back(served, random_pair) -> None:
    prompts = [[3 + i, 4, 5 + i, 9] for i in range(6)]
    expected = reference(random_pair, prompts, [100] * 6)
    old = served.child("draft")

    async def run_with_kill() -> list[tuple[list[int], str]]:
        tasks = [asyncio.create_task(grpc_run(served.grpc_port, p, 100)) for p in prompts]
        await asyncio.to_thread(wait_for_steps, served, 8)
        old.kill()
        return await asyncio.gather(*tasks)

    assert asyncio.run(run_with_kill()) == [(e, "length") for e in expected]
    wait_until(lambda: not psutil.pid_exists(old.pid) or old.status() != psutil.STATUS_ZOMBIE, timeout=10)
    assert not psutil.pid_exists(old.pid), "the dead draft service was reaped"
    wait_until(lambda: served.health()[1]["draft_state"] == "drafting", timeout=60)
    assert served.child("draft").pid != old.pid
    assert "draft exited with code -9; restarting it" in served.log.read_text()
    before = served.health()[1]
    assert before["fallbacks"] >= 1 and before["status"] == "ok"

    async def rerun() -> list[tuple[list[int], str]]:
        return await asyncio.gather(*[grpc_run(served.grpc_port, p, 40) for p in prompts])

    assert asyncio.run(rerun()) == [(e[:40], "length") for e in expected]
    assert served.health()[1]["steps_by_kind"]["psd"] > before["steps_by_kind"]["psd"], "PSD resumed"


def test_kill_9_of_the_verifier_fails_requests_clearly_then_service_resumes(served, random_pair) -> None:
    old = served.child("verifier")

    async def run_with_kill() -> tuple[list[BaseException | tuple[list[int], str]], float, dict]:
        tasks = [asyncio.create_task(grpc_run(served.grpc_port, [7 + i, 8, 9], 200)) for i in range(4)]
        await asyncio.to_thread(wait_for_steps, served, 6)
        killed = time.monotonic()
        old.kill()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        failed_after = time.monotonic() - killed
        return outcomes, failed_after, (await asyncio.to_thread(served.health))[1]

    outcomes, failed_after, during = asyncio.run(run_with_kill())
    for outcome in outcomes:
        assert isinstance(outcome, grpc.aio.AioRpcError), outcome
        assert outcome.code() == grpc.StatusCode.UNAVAILABLE and "the verifier was lost" in str(outcome.details())
    assert failed_after < 2.0, "requests on a dead verifier fail fast"
    assert during["status"] == "unavailable" and "verifier" in during["reason"]
    wait_until(served.back, timeout=90)
    assert served.child("verifier").pid != old.pid and served.health()[1]["verifier_reconnects"] == 1
    prompts = [[7 + i, 8, 9] for i in range(4)]
    expected = reference(random_pair, prompts, [30] * 4)

    async def rerun() -> list[tuple[list[int], str]]:
        return await asyncio.gather(*[grpc_run(served.grpc_port, p, 30) for p in prompts])

    assert asyncio.run(rerun()) == [(e, "length") for e in expected]
    print(f"requests on the killed verifier failed within {failed_after:.1f} s")


def test_sigterm_with_8_streams_in_flight_lets_all_finish_and_every_process_exits_0(served, random_pair) -> None:
    prompts = [[11 + i, 12, 13 + i] for i in range(8)]
    expected = reference(random_pair, prompts, [150] * 8)
    children = psutil.Process(served.proc.pid).children()
    assert len(children) == 3

    async def run_with_sigterm() -> tuple[list[tuple[list[int], str]], int, float]:
        started = [asyncio.Event() for _ in prompts]
        tasks = [asyncio.create_task(http_run(served.http, p, 150, started[i]) if i % 2 else
                                     grpc_run(served.grpc_port, p, 150)) for i, p in enumerate(prompts)]
        await asyncio.gather(*(e.wait() for i, e in enumerate(started) if i % 2))
        await asyncio.to_thread(wait_for_steps, served, 4)
        sent = time.monotonic()
        served.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        async with httpx.AsyncClient(timeout=10) as client:
            refused = await client.post(f"{served.http}/v1/completions", json={"prompt": [5], "max_tokens": 2})
        results = await asyncio.gather(*tasks)
        return results, refused.status_code, time.monotonic() - sent

    results, refused, finished_after = asyncio.run(run_with_sigterm())
    assert results == [(e, "length") for e in expected]
    assert refused == 503
    assert served.proc.wait(DRAIN_GRACE_S + 30) == 0
    drained_after = finished_after
    output = served.log.read_text()
    stopped = next(line for line in output.splitlines() if line.startswith("minedraft: stopped ("))
    assert sorted(stopped[len("minedraft: stopped ("):-1].split(", ")) == [
        "batch-manager exited 0", "draft exited 0", "verifier exited 0"]
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not any(psutil.pid_exists(c.pid) for c in children), "every child was reaped"
    print(f"8 streams finished {drained_after:.1f} s after SIGTERM")
