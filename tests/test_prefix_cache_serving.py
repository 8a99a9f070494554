"""Prefix caching and chunked prefill through the batch manager and the real workers (verifier and draft
service, each its own process, gloo data plane), in PSD, SD and AR: the output and the acceptance of every
request are those of a cold, unchunked run, whatever the cache held and however the prompt was chunked; a
repeated prompt hits all its full blocks but the last token's on both workers and the counters say so; salts
separate; n > 1 siblings share their prompt through the cache; a request cancelled in the middle of its chunks
leaks no block and leaves only what it verified cached. The worker's own side: test_prefix_cache_engine.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from minedraft.batch_manager.backend import GenerationChunk
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.core.prefix_hash import reusable_blocks
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from tests.conftest import wait_until, worker_info

NUM_BLOCKS = 256
BS = 16
PROMPTS = [[(13 * i + 5 * j) % 95 + 2 for i in range(n)] for j, n in enumerate((70, 37, 100))]


@pytest.fixture(scope="module")
def workers(random_pair, tmp_path_factory: pytest.TempPathFactory):
    # The draft is the target's own folder: drafts are accepted until a penalty changes the target's choice, so
    # accepted runs, rejections and bonus tokens all occur (test_logprobs_penalties_modes.py does the same).
    stack = LocalStack(StackConfig(target=str(random_pair[0]), draft=str(random_pair[0]), grpc_port=free_port(),
                                   http_port=free_port(), num_blocks=NUM_BLOCKS,
                                   log_dir=tmp_path_factory.mktemp("logs")))
    stack.start_verifier()
    stack.start_draft()
    yield stack, random_pair[0]
    stack.stop()


class Manager:
    """A batch manager (coordinator) in this process over the module's workers."""

    def __init__(self, workers: tuple[LocalStack, Path], mode: str = "psd", **config: Any) -> None:
        stack, folder = workers
        self.stack = stack
        draft = f"127.0.0.1:{stack.draft_port}" if mode != "ar" else None
        self.coordinator = Coordinator.over_grpc(Tokenizer(folder), "t", f"127.0.0.1:{stack.target_port}", draft,
                                                 ManagerConfig(mode=mode, k=3, **config))
        self.mode = mode

    async def __aenter__(self) -> Manager:
        await self.coordinator.start(connect_timeout=120)
        if self.mode != "ar":
            while self.coordinator.status()["draft_state"] != "drafting":  # the data plane forms after start
                await asyncio.sleep(0.05)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.coordinator.stop()
        for port in (self.stack.target_port, self.stack.draft_port):  # the next manager may connect
            while worker_info(port).manager_connected:
                await asyncio.sleep(0.02)

    def configure(self, caching: bool, budget: int) -> None:
        """Between requests: the settings a batch manager reads at every plan (flags fix them in a pod)."""
        config = self.coordinator.driver.config
        config.enable_prefix_caching, config.max_num_batched_tokens = caching, budget

    def cache(self, side: str = "target") -> dict[str, Any]:
        return self.coordinator.status()["prefix_cache"][side]

    async def one(self, prompt: list[int], params: SamplingParams, request_id: str = "r",
                  share: str | None = None) -> tuple[list[int], tuple[int, int]]:
        """Output tokens, and (drafted, accepted) while it ran (requests run one at a time here)."""
        before = self.coordinator.status()
        chunks = [c async for c in self.coordinator.generate(prompt, params, request_id, share_prompt=share)]
        await self.idle()
        after = self.coordinator.status()
        return ([t for c in chunks for t in c.token_ids],
                (after["drafted_total"] - before["drafted_total"], after["accepted_total"] - before["accepted_total"]))

    async def idle(self) -> None:
        """Every removal reached both workers: they hold no sequence."""
        driver = self.coordinator.driver
        while driver.pending_remove or driver.in_flight or driver.requests:
            await asyncio.sleep(0.01)


def params(salt: str | None = None, max_tokens: int = 12, penalty: float = 1.0) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, cache_salt=salt, repetition_penalty=penalty)


def prompt_params(salt: str | None = None) -> list[tuple[list[int], SamplingParams]]:
    """The prompts, the second with a penalty the draft does not apply (rejections)."""
    return [(p, params(salt, penalty=1.5 if i == 1 else 1.0)) for i, p in enumerate(PROMPTS)]


def assert_no_leak(stack: LocalStack) -> None:
    for port in (stack.target_port, stack.draft_port):
        wait_until(lambda port=port: worker_info(port).sequences == 0, timeout=30)
        assert worker_info(port).free_blocks == NUM_BLOCKS  # cached blocks nobody holds count as free


@pytest.mark.parametrize("mode", ["psd", "sd", "ar"])
def test_outputs_and_acceptance_are_the_cold_unchunked_ones_and_a_warm_prompt_hits_its_full_blocks(
        workers, mode: str) -> None:
    async def runs() -> None:
        async with Manager(workers, mode) as m:
            m.configure(caching=False, budget=100000)
            reference = [await m.one(p, q) for p, q in prompt_params()]
            assert m.cache()["prefill_tokens"] == 0 and m.cache()["queries"] == 0  # no chunk, no lookup
            for budget in (16, 40):
                m.configure(caching=True, budget=budget)
                before = {s: dict(m.cache(s)) for s in ("target", "draft")}
                salt = f"{mode}-{budget}"  # nothing of another run can be hit
                cold = [await m.one(p, q) for p, q in prompt_params(salt)]
                assert cold == reference, f"chunks of {budget}"
                assert m.cache()["hits"] == before["target"]["hits"]
                assert m.cache()["prefill_tokens"] > before["target"]["prefill_tokens"]
                warm = [await m.one(p, q) for p, q in prompt_params(salt)]
                assert warm == reference, f"cached, chunks of {budget}"
                hits = sum(reusable_blocks(len(p), BS) * BS for p in PROMPTS)
                queries = 2 * sum(len(p) for p in PROMPTS)
                sides = ["target"] if mode == "ar" else ["target", "draft"]
                assert {s: (m.cache(s)["queries"] - before[s]["queries"], m.cache(s)["hits"] - before[s]["hits"])
                        for s in sides} == {s: (queries, hits) for s in sides}
        if mode != "ar":
            judged = [(drafted, accepted) for _, (drafted, accepted) in reference]
            assert all(a > 0 for _, a in judged) and any(a < d for d, a in judged), "accepted and rejected drafts"

    asyncio.run(asyncio.wait_for(runs(), 240))
    assert_no_leak(workers[0])


def test_a_salt_only_hits_its_own_blocks(workers) -> None:
    prompt = PROMPTS[2]

    async def runs() -> list[int]:
        async with Manager(workers) as m:
            hits = []
            for salt in ("tenant-a", "tenant-b", "tenant-a", None):
                await m.one(prompt, params(salt))
                hits.append(m.cache()["hits"] - sum(hits))
            return hits

    assert asyncio.run(asyncio.wait_for(runs(), 120)) == [0, 0, 96, 0]


def test_siblings_share_the_prompt_through_the_cache_on_both_workers(workers) -> None:
    prompt = PROMPTS[0] + PROMPTS[1]  # 107 tokens: 6 full blocks a sibling need not compute

    async def runs() -> tuple[list[list[int]], list[list[int]], dict[str, int]]:
        async with Manager(workers) as m:
            p = params("siblings")
            shared = await asyncio.gather(*(m.one(prompt, p, f"n{i}", share="parent") for i in range(4)))
            hits = {s: m.cache(s)["hits"] for s in ("target", "draft")}
        async with Manager(workers, enable_prefix_caching=False) as m:
            alone = [await m.one(prompt, params()) for _ in range(4)]
        return [o for o, _ in shared], [o for o, _ in alone], hits

    shared, alone, hits = asyncio.run(asyncio.wait_for(runs(), 120))
    assert shared == alone
    assert hits == {"target": 3 * 96, "draft": 3 * 96}  # the leader computes the prompt, three siblings hit it


def test_a_request_cancelled_between_its_chunks_leaks_nothing_and_leaves_only_its_chunks_cached(workers) -> None:
    prompt = [(7 * i) % 95 + 2 for i in range(200)]

    async def cancelled(chunks: AsyncIterator[GenerationChunk]) -> None:
        async with aclosing(chunks) as stream:
            async for _ in stream:
                break

    async def runs() -> tuple[list[int], list[int], int, int]:
        async with Manager(workers, max_num_batched_tokens=16) as m:
            driver = m.coordinator.driver
            task = asyncio.create_task(cancelled(m.coordinator.generate(prompt, params("cut"), "cut")))
            while driver.step < 4:  # a few chunks are out, the prompt (12 chunks at least) is not done
                await asyncio.sleep(0.001)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await m.idle()
            assert_no_leak(m.stack)
            partial = m.cache()["prefill_tokens"]
            again, _ = await m.one(prompt, params("cut"))
            hit = m.cache()["hits"]
        async with Manager(workers, enable_prefix_caching=False, max_num_batched_tokens=100000) as m:
            reference, _ = await m.one(prompt, params())
        return again, reference, partial, hit

    again, reference, partial, hit = asyncio.run(asyncio.wait_for(runs(), 120))
    assert again == reference
    assert 0 < partial < len(prompt) - 1 and 0 < hit <= (partial // BS) * BS  # verified chunks only
    assert_no_leak(workers[0])


def test_a_mode_change_between_a_prompts_chunks_keeps_its_output(workers) -> None:
    prompt = [(5 * i) % 95 + 2 for i in range(180)]

    async def runs() -> tuple[list[int], list[int]]:
        async with Manager(workers, enable_prefix_caching=False, max_num_batched_tokens=100000) as m:
            reference, _ = await m.one(prompt, params())
        async with Manager(workers, max_num_batched_tokens=16) as m:
            driver = m.coordinator.driver
            task = asyncio.create_task(m.one(prompt, params("mode-change")))
            while driver.step < 3:
                await asyncio.sleep(0.001)
            assert driver.prompts.active, "the prompt must still be in its chunks"
            await m.coordinator.apply_policy(mode="ar")
            start = driver.step
            while driver.step < start + 3:
                await asyncio.sleep(0.001)
            await m.coordinator.apply_policy(mode="psd")
            out, _ = await task
        return reference, out

    reference, out = asyncio.run(asyncio.wait_for(runs(), 120))
    assert out == reference
    assert_no_leak(workers[0])


@pytest.fixture(scope="module")
def colocated(random_pair, tmp_path_factory: pytest.TempPathFactory):
    """A verifier that drafts on its own model (--colocated-draft): both caches live in its process."""
    env = {"verifier": {"MINEDRAFT_COLOCATED_DRAFT": str(random_pair[0])}}
    stack = LocalStack(StackConfig(target=str(random_pair[0]), draft=str(random_pair[0]), grpc_port=free_port(),
                                   http_port=free_port(), num_blocks=NUM_BLOCKS, process_env=env,
                                   log_dir=tmp_path_factory.mktemp("colocated")))
    stack.start_verifier()
    yield stack, random_pair[0]
    stack.stop()


def test_the_colocated_draft_model_caches_and_chunks_too(colocated) -> None:
    stack, folder = colocated

    async def runs() -> tuple[list, list, list, dict[str, Any]]:
        coordinator = Coordinator.over_grpc(Tokenizer(folder), "t", f"127.0.0.1:{stack.target_port}", None,
                                            ManagerConfig(mode="sd", k=3, max_num_batched_tokens=16))
        await coordinator.start(connect_timeout=120)
        try:
            async def one(p: list[int], q: SamplingParams) -> list[int]:
                return [t async for c in coordinator.generate(p, q, "r") for t in c.token_ids]

            coordinator.driver.config.enable_prefix_caching = False
            reference = [await one(p, q) for p, q in prompt_params()]
            coordinator.driver.config.enable_prefix_caching = True
            cold = [await one(p, q) for p, q in prompt_params("colocated")]
            warm = [await one(p, q) for p, q in prompt_params("colocated")]
            return reference, cold, warm, coordinator.status()["prefix_cache"]
        finally:
            await coordinator.stop()

    reference, cold, warm, cache = asyncio.run(asyncio.wait_for(runs(), 120))
    assert cold == reference and warm == reference
    hits = sum(reusable_blocks(len(p), BS) * BS for p in PROMPTS)
    assert cache["target"]["hits"] == hits and cache["draft"]["hits"] == hits
    assert cache["target"]["prefill_tokens"] > 0 and cache["draft"]["prefill_tokens"] > 0
