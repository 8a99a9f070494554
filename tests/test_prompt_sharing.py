"""n > 1: the siblings of one request share its prompt's KV in each worker, computed once per worker.

The step loop's plans over fake workers (who waits, who forks, who leads when the leader leaves), and the real
workers in their own processes with the batch manager's loop in this one (exact
outputs against independent requests, prompt tokens not recomputed, no KV block left behind). One worker's
block sharing: test_kv_block_sharing.py.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Coroutine
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from minedraft.batch_manager.backend import GenerationChunk
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from tests.conftest import wait_until, worker_info
from tests.fake_worker_links import greedy
from tests.step_driver_support import Stack, drive, until, word_tokenizer

BS = 16

# ----- the step loop's plans, over fake workers -----------------------------------------------


@pytest.fixture(scope="module")
def words(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return word_tokenizer(Path(tmp_path_factory.mktemp("tok")))


async def collect(chunks: AsyncIterator[GenerationChunk]) -> list[int]:
    out: list[int] = []
    async with aclosing(chunks) as stream:
        async for chunk in stream:
            out += chunk.token_ids
    return out


def adds(stack: Stack) -> list[tuple[int, int, int | None]]:
    """(step, seq id, fork_of) of every sequence added to the verifier."""
    return [(p.step, a.seq_id, a.fork_of if a.HasField("fork_of") else None)
            for p in stack.verifier.plans for a in p.add]


def fake_stack(words: Tokenizer, prefix_caching: bool = False) -> Stack:
    """Prefix caching off: siblings fork (with it on they share the prompt through the cache, see below)."""
    return Stack(words, ManagerConfig(mode="psd", k=2, pipeline_depth=1, draft_retry_s=0.0,
                                      enable_prefix_caching=prefix_caching), lambda seq_id, step: 99)


def test_siblings_wait_for_the_leaders_first_verdict_then_fork_it(words) -> None:
    prompt = [5, 6, 7]

    async def scenario() -> None:
        stack = fake_stack(words)
        await stack.coordinator.start()
        params = SamplingParams(max_tokens=6, ignore_eos=True)
        runs = [collect(stack.coordinator.generate(prompt, params, f"r{i}", share_prompt="parent"))
                for i in range(3)]
        other = collect(stack.coordinator.generate([8, 9], params, "other"))
        got = await asyncio.gather(*runs, other)
        assert got == [greedy(prompt, 6)] * 3 + [greedy([8, 9], 6)]
        await stack.settle()
        # 1 leads; 4 (no sibling) starts at once; 2 and 3 start once 1's verdict of step 1 is back, forking it.
        assert adds(stack) == [(0, 1, None), (0, 4, None), (2, 2, 1), (2, 3, 1)]
        forks = [a for p in stack.verifier.plans for a in p.add if a.HasField("fork_of")]
        assert [a.fork_tokens for a in forks] == [3, 3]
        assert len(stack.driver.admission.siblings) == 0 and stack.verifier.seqs == {}
        await stack.coordinator.stop()

    drive(scenario)


def test_a_leader_that_leaves_before_its_verdict_hands_the_lead_on(words) -> None:
    prompt = [5, 6, 7]

    async def scenario() -> None:
        stack = fake_stack(words)
        await stack.coordinator.start()
        stack.verifier.pause_at(0)  # the leader's verdicts are held
        params = SamplingParams(max_tokens=6, ignore_eos=True)
        leader = asyncio.create_task(collect(stack.coordinator.generate(prompt, params, "a", share_prompt="p")))
        await until(lambda: stack.driver.requests)
        rest = [asyncio.create_task(collect(stack.coordinator.generate(prompt, params, f"b{i}", share_prompt="p")))
                for i in range(2)]
        await until(lambda: len(stack.driver.admission.waiting) == 2)
        leader.cancel()
        await until(lambda: leader.done())
        stack.verifier.resume()
        assert await asyncio.gather(*rest) == [greedy(prompt, 6)] * 2
        await stack.settle()
        first, second = (a for a in adds(stack) if a[1] != 1)
        assert first[2] is None and second == (second[0], 3, 2)  # 2 computes the prompt, 3 forks it
        assert len(stack.driver.admission.siblings) == 0 and stack.verifier.seqs == {}
        await stack.coordinator.stop()

    drive(scenario)


# ----- the real workers, each in its own process ------------------------------------------------

NUM_BLOCKS = 256
PROMPT = [(11 * i) % 1500 + 20 for i in range(40)]  # P = 40: each fork shares floor(39 / 16) * 16 = 32 tokens
SHARED = 32


class RealWorkers:
    """The verifier and the draft service as processes; the batch manager's loop on this test's event loop."""

    def __init__(self, log_dir: Path) -> None:
        self.stack = LocalStack(StackConfig(target=str(TINY_TARGET), draft=str(TINY_DRAFT), k=3,
                                            num_blocks=NUM_BLOCKS, log_dir=log_dir))
        self.loop = asyncio.new_event_loop()
        self.coordinator: Coordinator | None = None

    def start(self) -> None:
        self.stack.start_verifier()
        self.stack.start_draft()
        for port in self.ports:
            wait_until(lambda port=port: self._answers(port), timeout=120)
        # Prefix caching off: this module tests forks (through the cache: test_prefix_cache_serving.py).
        cfg = ManagerConfig(mode="psd", k=3, draft_retry_s=0.2, enable_prefix_caching=False)
        self.coordinator = Coordinator.over_grpc(Tokenizer(TINY_TARGET), "tiny", f"127.0.0.1:{self.stack.target_port}",
                                                 f"127.0.0.1:{self.stack.draft_port}", cfg)
        self.run(self.coordinator.start())

    @property
    def ports(self) -> tuple[int, int]:
        return self.stack.target_port, self.stack.draft_port

    @staticmethod
    def _answers(port: int) -> bool:
        try:
            worker_info(port)
        except Exception:  # not up yet
            return False
        return True

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 240.0) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def stop(self) -> None:
        if self.coordinator is not None:
            self.run(self.coordinator.stop())
        self.loop.close()
        self.stack.stop()

    def shared_tokens(self) -> dict[str, int]:
        """Prompt positions each worker took from a sibling so far (its log says each fork)."""
        assert self.stack.cfg.log_dir is not None
        pattern = re.compile(r"sequence \d+ shares (\d+) prompt tokens")
        return {name: sum(int(m) for m in pattern.findall((self.stack.cfg.log_dir / f"{name}.log").read_text()))
                for name in ("verifier", "draft")}

    def assert_all_free(self) -> None:
        """Every block back on both workers. The manager's loop runs meanwhile: the plan that removes the last
        requests may still be queued on its link when `run` returns (this loop only runs inside `run`)."""

        async def all_free() -> None:
            while not all(info.free_blocks == NUM_BLOCKS
                          for info in await asyncio.gather(*(asyncio.to_thread(worker_info, p) for p in self.ports))):
                await asyncio.sleep(0.01)

        self.run(all_free(), timeout=30)  # asyncio's TimeoutError after 30 s with a block still held
        assert [worker_info(port).sequences for port in self.ports] == [0, 0]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory):
    workers = RealWorkers(tmp_path_factory.mktemp("logs"))
    workers.start()
    yield workers
    workers.stop()


def sampling(seed: int, temperature: float) -> SamplingParams:
    return SamplingParams(max_tokens=24, temperature=temperature, seed=seed, ignore_eos=True)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_four_siblings_give_four_independent_requests_outputs_computing_the_prompt_once(real, temperature) -> None:
    coord = real.coordinator
    assert coord is not None
    seeds = range(7, 11)

    async def siblings() -> list[list[int]]:
        return await asyncio.gather(*(collect(coord.generate(PROMPT, sampling(s, temperature), f"n{s}",
                                                             share_prompt=f"parent-{temperature}")) for s in seeds))

    async def independent() -> list[list[int]]:
        return await asyncio.gather(*(collect(coord.generate(PROMPT, sampling(s, temperature), f"i{s}"))
                                      for s in seeds))

    before = real.shared_tokens()
    shared = real.run(siblings())
    after = real.shared_tokens()
    alone = real.run(independent())
    assert shared == alone and all(len(out) == 24 for out in shared)
    if temperature:
        assert len({tuple(out) for out in shared}) > 1, "different seeds should sample different outputs"
    # Three of the four never computed the prompt's first 32 tokens, on either worker.
    assert {name: after[name] - before[name] for name in after} == {"verifier": 3 * SHARED, "draft": 3 * SHARED}
    assert real.shared_tokens() == after  # independent requests share nothing
    real.assert_all_free()


def test_a_sibling_cancelled_mid_way_and_a_leader_cancelled_before_its_verdict_leak_no_block(real) -> None:
    coord = real.coordinator
    assert coord is not None
    driver = coord.driver

    async def cancelled_after(chunks: AsyncIterator[GenerationChunk], count: int) -> int:
        seen = 0
        async with aclosing(chunks) as stream:
            async for _ in stream:
                seen += 1
                if seen == count:
                    break
        return seen

    async def one_cancelled_mid_way() -> list[object]:
        params = [SamplingParams(max_tokens=40, ignore_eos=True) for _ in range(4)]
        calls = [coord.generate(PROMPT, p, f"m{i}", share_prompt="mid") for i, p in enumerate(params)]
        return await asyncio.gather(cancelled_after(calls[2], 3), *(collect(c) for c in calls[:2] + calls[3:]))

    async def leader_cancelled_before_its_verdict() -> list[list[int]]:
        params = SamplingParams(max_tokens=20, ignore_eos=True)
        leader = asyncio.create_task(collect(coord.generate(PROMPT, params, "lead", share_prompt="early")))
        while not driver.requests:  # the leader's first plan is out, its verdict cannot be back yet
            await asyncio.sleep(0)
        req = next(iter(driver.requests.values()))
        rest = [asyncio.create_task(collect(coord.generate(PROMPT, params, f"e{i}", share_prompt="early")))
                for i in range(3)]
        leader.cancel()
        await asyncio.gather(leader, return_exceptions=True)
        assert req.stats.steps == 0 and not req.output_ids  # it left before any verdict
        return await asyncio.gather(*rest)

    expected = real.run(collect(coord.generate(PROMPT, SamplingParams(max_tokens=40, ignore_eos=True), "ref")))
    before = real.shared_tokens()
    got = real.run(one_cancelled_mid_way())
    assert got[0] == 3 and got[1:] == [expected] * 3
    real.assert_all_free()
    middle = real.shared_tokens()
    assert {name: middle[name] - before[name] for name in middle} == {"verifier": 3 * SHARED, "draft": 3 * SHARED}
    assert real.run(leader_cancelled_before_its_verdict()) == [expected[:20]] * 3
    real.assert_all_free()
    after = real.shared_tokens()
    # The leader's KV went with it: the next sibling computed the prompt, the last two forked it.
    assert {name: after[name] - middle[name] for name in after} == {"verifier": 2 * SHARED, "draft": 2 * SHARED}
    assert len(driver.admission.siblings) == 0


def test_forked_siblings_get_the_prompt_logprobs_their_source_computed(real) -> None:
    coord = real.coordinator
    assert coord is not None

    async def prompt_logprobs(key: str | None, seed: int) -> list[object]:
        params = SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=2, seed=seed)
        got: list[object] = []
        async with aclosing(coord.generate(PROMPT, params, f"pl{seed}", share_prompt=key)) as stream:
            async for chunk in stream:
                got += chunk.prompt_logprobs or []
        return got

    before = real.shared_tokens()
    async def siblings() -> list[list[object]]:
        return await asyncio.gather(*(prompt_logprobs("with-prompt-logprobs", s) for s in range(3)))

    shared = real.run(siblings())
    after = real.shared_tokens()
    alone = real.run(prompt_logprobs(None, 0))
    assert len(alone) == len(PROMPT) and alone[0] is None
    assert shared == [alone] * 3
    assert {name: after[name] - before[name] for name in after} == {"verifier": 2 * SHARED, "draft": 2 * SHARED}
    real.assert_all_free()
