"""SamplingParams.priority (vLLM's priority policy): lower numbers start first, ties in arrival order; when KV
runs out the highest number, newest first, gives way."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from minedraft.batch_manager.admission import Admission, KvLimits
from minedraft.batch_manager.config import ManagerConfig
from minedraft.core.request import Request
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from tests.fake_worker_links import greedy
from tests.step_driver_support import Stack, drive, until, word_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return word_tokenizer(Path(tmp_path_factory.mktemp("tok")))


async def run(stack: Stack, prompt: list[int], priority: int) -> list[int]:
    params = SamplingParams(max_tokens=4, ignore_eos=True, priority=priority)
    out: list[int] = []
    async for chunk in stack.coordinator.generate(prompt, params, f"p{priority}"):
        out += chunk.token_ids
    return out


def test_queued_requests_start_by_priority_then_arrival(tokenizer) -> None:
    async def scenario() -> None:
        stack = Stack(tokenizer, ManagerConfig(mode="psd", k=2, pipeline_depth=1, max_num_seqs=1, draft_retry_s=0.0),
                      lambda seq_id, step: 99)
        await stack.coordinator.start()
        first = asyncio.create_task(run(stack, [5, 6], 3))  # runs alone: max_num_seqs is 1
        await until(lambda: stack.driver.requests)
        prompts = {2: [7, 8], 3: [9, 10], 4: [11, 12], 5: [13, 14]}  # sequence id -> prompt
        priorities = {2: 2, 3: 0, 4: 1, 5: 0}
        queued = [asyncio.create_task(run(stack, prompts[s], priorities[s])) for s in prompts]
        got = await asyncio.gather(first, *queued)
        assert got == [greedy([5, 6], 4), *(greedy(prompts[s], 4) for s in prompts)]
        await stack.settle()
        started = [a.seq_id for p in stack.verifier.plans for a in p.add]
        assert started == [1, 3, 5, 4, 2]  # priority 0 (3 before 5: arrival), then 1, then 2
        await stack.coordinator.stop()

    drive(scenario)


def request(seq_id: int, priority: int, tokens: int = 16) -> Request:
    return Request(seq_id, list(range(2, 2 + tokens)), SamplingParams(max_tokens=8, priority=priority))


def test_preemption_takes_the_highest_priority_number_newest_first_and_requeues_by_priority() -> None:
    admission = Admission(max_queue=8)
    admission.limits = KvLimits(max_context=512, vocab_size=64, block_budget=2, block_size=16)
    running = [request(1, 0), request(2, 1), request(3, 0), request(4, 1)]  # one block each, in arrival order
    waiting = request(5, 0)
    admission.waiting.append(waiting)
    change = admission.plan(running, in_flight=0, k=0, max_num_seqs=8)
    assert [r.req_id for r in change.preempt] == [4, 2] and change.start == []
    admission.requeue(change.preempt)
    assert [r.req_id for r in admission.waiting] == [5, 2, 4]  # priority 0 first; 2 arrived before 4
    admission.limits.block_budget = 8
    change = admission.plan(running[::2], in_flight=0, k=0, max_num_seqs=3)
    assert [r.req_id for r in change.start] == [5] and [r.req_id for r in admission.waiting] == [2, 4]


def test_default_priority_keeps_arrival_order_and_puts_preempted_requests_first() -> None:
    admission = Admission(max_queue=8)
    admission.limits = KvLimits(max_context=512, vocab_size=64, block_budget=1, block_size=16)
    running = [request(1, 0), request(2, 0)]
    later = request(3, 0)
    admission.waiting.append(later)
    change = admission.plan(running, in_flight=0, k=0, max_num_seqs=8)
    assert [r.req_id for r in change.preempt] == [2]
    admission.requeue(change.preempt)
    assert [r.req_id for r in admission.waiting] == [2, 3]
