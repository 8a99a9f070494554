"""Admission by KV growth, preemption, a returning verifier, the drain and /health's status, over
the real batch manager and in-memory fake workers that count KV blocks like the real ones."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path

import httpx
import pytest

from minedraft.batch_manager.backend import UnavailableError
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.batch_manager.http_api import build_http_app
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from tests.fake_worker_links import greedy
from tests.kv_checking_links import kv_stack
from tests.step_driver_support import drive, word_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return word_tokenizer(Path(tmp_path_factory.mktemp("tok")))


def one_right(seq_id: int, step: int) -> int:
    return 1


def config(**extra: object) -> ManagerConfig:
    return ManagerConfig(**{"mode": "psd", "k": 2, "pipeline_depth": 2, "draft_retry_s": 0.01, **extra})  # type: ignore[arg-type]


async def run(coordinator: Coordinator, prompt: list[int], max_tokens: int,
              finished: list[int] | None = None, tag: int = 0) -> tuple[list[int], str | None]:
    """A whole request: its streamed token ids (every chunk, so a token sent twice shows) and finish reason."""
    out: list[int] = []
    reason = None
    async with aclosing(coordinator.generate(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                             "t")) as chunks:
        async for chunk in chunks:
            out += chunk.token_ids
            reason = chunk.finish_reason
    if finished is not None:
        finished.append(tag)
    return out, reason


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def test_a_short_request_is_not_starved_by_long_ones(tokenizer) -> None:
    """Reserving each request's worst case let 3 of these long requests hold the whole cache,
    so the short one waited for a long one to finish; counted by growth it starts at once."""

    async def scenario() -> None:
        coordinator, verifier, draft = kv_stack(tokenizer, config(), 64, one_right)
        await coordinator.start()
        longs = [[3 + i, 4, 5, 6, 7, 8, 9, 10] for i in range(6)]
        finished: list[int] = []
        tasks = [asyncio.create_task(run(coordinator, p, 300, finished, i)) for i, p in enumerate(longs)]
        await eventually(lambda: coordinator.driver.step >= 4)
        short = asyncio.create_task(run(coordinator, [20, 21, 22], 4, finished, 99))
        assert await short == (greedy([20, 21, 22], 4), "length")
        assert finished == [99], "the short request finished before every long one"
        assert [await t for t in tasks] == [(greedy(p, 300), "length") for p in longs]
        assert verifier.ledger.overflows == [] and draft is not None and draft.ledger.overflows == []
        await coordinator.stop()

    drive(scenario, timeout_s=60)


# (mode, k, pipeline depth, cache blocks, requests, prompt length, max_tokens): each overfills the
# cache many times over; the last three also overfill it when plans in flight are not counted.
PREEMPTION_CASES = [("psd", 2, 2, 14, 5, 10, 110), ("ar", 1, 4, 20, 12, 3, 60), ("psd", 4, 4, 20, 12, 3, 60),
                    ("sd", 6, 4, 24, 10, 5, 80)]


@pytest.mark.parametrize(("mode", "k", "depth", "num_blocks", "count", "prompt_len", "max_tokens"), PREEMPTION_CASES)
def test_preemption_keeps_greedy_output_exact_and_never_overfills_the_cache(
        tokenizer, mode: str, k: int, depth: int, num_blocks: int, count: int, prompt_len: int,
        max_tokens: int) -> None:
    async def scenario() -> None:
        coordinator, verifier, draft = kv_stack(tokenizer, config(mode=mode, k=k, pipeline_depth=depth), num_blocks,
                                                one_right)
        await coordinator.start()
        prompts = [[7 + i, *range(20, 19 + prompt_len)] for i in range(count)]
        got = await asyncio.gather(*(run(coordinator, p, max_tokens) for p in prompts))
        assert got == [(greedy(p, max_tokens), "length") for p in prompts]  # no token lost, none streamed twice
        status = coordinator.status()
        assert status["preemptions"] > 0 and status["running"] == 0 and status["waiting"] == 0
        assert verifier.ledger.overflows == [] and draft is not None and draft.ledger.overflows == []
        assert verifier.ledger.peak >= num_blocks * 3 // 4, "the cache was used near its size"
        await eventually(lambda: not verifier.seqs and not draft.seqs)  # every sequence left both workers
        await coordinator.stop()

    drive(scenario, timeout_s=60)


def test_a_request_that_could_never_fit_is_refused_and_a_full_queue_says_so(tokenizer) -> None:
    async def scenario() -> None:
        coordinator, verifier, _ = kv_stack(tokenizer, config(max_queue=1, max_num_seqs=1), 14, one_right)
        await coordinator.start()
        with pytest.raises(ValueError, match="more KV memory than the whole cache") as err:
            await anext(coordinator.generate([5] * 10, SamplingParams(max_tokens=300), "t"))
        assert getattr(err.value, "param", None) == "max_tokens"
        verifier.pause_at(0)
        first = asyncio.create_task(run(coordinator, [5, 6], 20))
        await verifier.paused.wait()
        second = asyncio.create_task(run(coordinator, [7, 8], 20))
        await eventually(lambda: len(coordinator.admission.waiting) == 1)
        with pytest.raises(Exception, match="already waiting") as full:
            await anext(coordinator.generate([9], SamplingParams(max_tokens=2), "t"))
        assert type(full.value).__name__ == "QueueFullError" and full.value.retry_after_s >= 1  # type: ignore[attr-defined]
        verifier.resume()
        assert [r for _, r in await asyncio.gather(first, second)] == ["length", "length"]
        await coordinator.stop()

    drive(scenario, timeout_s=30)


def test_a_lost_verifier_fails_requests_fast_and_the_manager_reconnects_when_it_returns(tokenizer) -> None:
    async def scenario() -> None:
        coordinator, verifier, draft = kv_stack(tokenizer, config(), 256, one_right)
        await coordinator.start()
        verifier.pause_at(3)
        doomed = asyncio.create_task(run(coordinator, [5, 6, 7], 50))
        await verifier.paused.wait()
        verifier.crash()
        with pytest.raises(UnavailableError, match="the verifier was lost"):
            await doomed
        assert coordinator.status()["status"] == "unavailable"
        with pytest.raises(UnavailableError, match="not connected"):
            await anext(coordinator.generate([5], SamplingParams(max_tokens=2), "t"))
        verifier.resume()
        verifier.up.set()  # the restarted verifier answers on the same address
        await eventually(lambda: coordinator.status()["status"] == "ok" and coordinator.status()["draft_connected"])
        before = coordinator.status()["steps_by_kind"]
        assert await run(coordinator, [5, 6, 7], 30) == (greedy([5, 6, 7], 30), "length")
        after = coordinator.status()
        assert after["verifier_reconnects"] == 1 and verifier.streams_opened == 2
        assert after["steps_by_kind"]["sd"] > before["sd"], "speculation resumed with the draft back in the loop"
        assert draft is not None and draft.streams_opened == 2 and len(draft.setups) == 2
        await coordinator.stop()

    drive(scenario, timeout_s=30)


def test_health_says_degraded_with_the_reason_while_the_draft_is_gone(tokenizer) -> None:
    async def scenario() -> None:
        coordinator, _, draft = kv_stack(tokenizer, config(), 256, one_right)
        await coordinator.start()
        assert (coordinator.status()["status"], coordinator.status()["reason"]) == ("ok", "")
        assert draft is not None
        draft.kill()
        await run(coordinator, [5, 6], 6)  # a step notices the broken data plane
        await eventually(lambda: coordinator.status()["status"] == "degraded")
        assert "draft service lost" in str(coordinator.status()["reason"])
        draft.restart()
        await eventually(lambda: coordinator.status()["status"] == "ok")
        await coordinator.stop()

    drive(scenario, timeout_s=30)


def test_the_drain_refuses_new_requests_and_lets_running_ones_finish(tokenizer) -> None:
    async def scenario() -> None:
        coordinator, _, _ = kv_stack(tokenizer, config(), 256, one_right)
        await coordinator.start()
        running = [asyncio.create_task(run(coordinator, [5 + i, 6], 40)) for i in range(3)]
        await eventually(lambda: coordinator.driver.step >= 2)
        drain = asyncio.create_task(coordinator.drain(grace_s=20))
        await asyncio.sleep(0)
        assert coordinator.status()["status"] == "draining"
        with pytest.raises(UnavailableError, match="shutting down"):
            await anext(coordinator.generate([5], SamplingParams(max_tokens=2), "t"))
        assert [await t for t in running] == [(greedy([5 + i, 6], 40), "length") for i in range(3)]
        assert await drain < 20
        await coordinator.stop()

    drive(scenario, timeout_s=30)


def test_past_the_drain_grace_what_is_left_ends_with_abort(tokenizer) -> None:
    async def scenario() -> None:
        coordinator, verifier, _ = kv_stack(tokenizer, config(), 256, one_right)
        await coordinator.start()
        verifier.pause_at(2)  # the verifier stops answering: nothing can finish on its own
        stuck = asyncio.create_task(run(coordinator, [5, 6], 40))
        await verifier.paused.wait()
        took = await coordinator.drain(grace_s=0.2)
        tokens, reason = await stuck
        assert 0.2 <= took < 2 and reason == "abort" and tokens == greedy([5, 6], len(tokens))
        await coordinator.stop()

    drive(scenario, timeout_s=30)


def test_over_http_a_full_queue_is_429_with_retry_after_and_a_timeout_is_408_or_abort(tokenizer) -> None:
    async def scenario() -> None:
        coordinator, verifier, _ = kv_stack(tokenizer, config(max_queue=1, max_num_seqs=1), 256, one_right)
        await coordinator.start()
        app = build_http_app(coordinator)
        verifier.pause_at(3)  # from step 3 on nothing finishes: only the deadline ends a request
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bm") as client:
            body = {"prompt": [5, 6], "max_tokens": 50, "temperature": 0, "ignore_eos": True, "timeout": 0.3}
            streamed = await client.post("/v1/completions", json={**body, "stream": True})
            events = [json.loads(line[6:]) for line in streamed.text.splitlines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
            assert streamed.status_code == 200 and events[-1]["choices"][0]["finish_reason"] == "abort"
            words = "".join(e["choices"][0]["text"] for e in events).split()
            assert words and words == [f"w{t}" for t in greedy([5, 6], 3)][: len(words)]
            verifier.resume()
            verifier.pause_at(coordinator.driver.step + 1)  # the next request starts, then nothing moves
            running = asyncio.create_task(client.post("/v1/completions", json={**body, "timeout": 1.0}))
            await eventually(lambda: coordinator.status()["running"] == 1)
            waiting = asyncio.create_task(client.post("/v1/completions", json=body))
            await eventually(lambda: len(coordinator.admission.waiting) == 1)
            full = await client.post("/v1/completions", json=body)
            assert full.status_code == 429 and full.headers["retry-after"] == "1"
            assert full.json()["error"]["code"] == "rate_limit_exceeded"
            for reply in (await waiting, await running):  # nothing was sent before the deadline
                assert reply.status_code == 408 and reply.json()["error"]["code"] == "request_timeout"
                assert reply.json()["error"]["param"] == "timeout"
        await eventually(lambda: coordinator.status()["running"] == 0 and not coordinator.admission.waiting)
        verifier.resume()
        await coordinator.stop()

    drive(scenario, timeout_s=30)


def test_a_stream_past_its_deadline_still_gets_the_text_held_back_for_a_stop_string(tokenizer) -> None:
    async def scenario() -> None:
        coordinator, verifier, _ = kv_stack(tokenizer, config(), 256, one_right)
        await coordinator.start()
        app = build_http_app(coordinator)
        verifier.pause_at(4)  # a few steps of text, then only the deadline ends the request
        body = {"prompt": [5, 6], "max_tokens": 50, "temperature": 0, "ignore_eos": True, "timeout": 0.3,
                "stream": True, "stop": ["never-said-xyz"], "stream_options": {"include_usage": True}}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bm") as client:
            streamed = await client.post("/v1/completions", json=body)
        events = [json.loads(line[6:]) for line in streamed.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        choices = [e["choices"][0] for e in events if e["choices"]]
        produced = events[-1]["usage"]["completion_tokens"]
        assert streamed.status_code == 200 and choices[-1]["finish_reason"] == "abort" and produced >= 3
        # While running, the last 13 characters wait in case they start the stop string; the abort releases them.
        assert "".join(c["text"] for c in choices) == tokenizer.decode(greedy([5, 6], produced))
        await eventually(lambda: coordinator.status()["running"] == 0)
        verifier.resume()
        await coordinator.stop()

    drive(scenario, timeout_s=30)
