"""n > 1: the siblings of one request share its prompt's KV in each worker, computed once per worker.

From the bottom up: the block allocator's reference counts, a real drafter forking a sibling (same drafts, the
shared blocks never written), the step loop's plans over fake workers (who waits, who forks, who leads when the
leader leaves), and the real workers in their own processes with the batch manager's loop in this one (exact
outputs against independent requests, prompt tokens not recomputed, no KV block left behind).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Coroutine
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import torch

from minedraft.batch_manager.backend import GenerationChunk
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig
from minedraft.core.errors import OutOfBlocksError
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.drafter import Drafter
from minedraft.engine.kv_cache import BlockAllocator
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.proto import control_pb2
from minedraft.worker.membership import apply_membership
from tests.conftest import wait_until, worker_info
from tests.fake_worker_links import greedy
from tests.step_driver_support import Stack, drive, until, word_tokenizer

BS = 16

# ----- the allocator -------------------------------------------------------------------------


def test_share_gives_the_child_the_parents_full_blocks_before_its_last_prompt_token() -> None:
    alloc = BlockAllocator(10, BS)
    alloc.ensure(1, 40)  # 3 blocks
    parent = alloc.table(1)
    assert alloc.share(1, 2, 40) == 32  # floor(39 / 16) = 2 blocks
    assert alloc.table(2) == parent[:2] and [alloc.refs(b) for b in parent] == [2, 2, 1]
    assert alloc.num_free == 7
    assert alloc.share(1, 3, 33) == 32 and alloc.share(1, 4, 32) == 16 and alloc.share(1, 5, 16) == 0
    assert alloc.table(5) == [] and alloc.refs(parent[0]) == 4 and alloc.num_free == 7
    alloc.ensure(2, 41)  # the child grows with blocks of its own, after the shared ones
    assert alloc.table(2)[:2] == parent[:2] and alloc.refs(alloc.table(2)[2]) == 1 and alloc.num_free == 6
    with pytest.raises(ValueError):
        alloc.share(1, 2, 40)  # a child that holds blocks already
    with pytest.raises(ValueError):
        alloc.share(1, 6, 65)  # more than the parent holds


def test_freeing_the_parent_first_keeps_the_shared_blocks_until_the_child_goes() -> None:
    alloc = BlockAllocator(8, BS)
    alloc.ensure(1, 40)
    shared = alloc.table(1)[:2]
    alloc.share(1, 2, 40)
    alloc.ensure(2, 40)
    assert alloc.num_free == 4
    alloc.free(1)
    assert alloc.num_free == 5 and [alloc.refs(b) for b in shared] == [1, 1]  # only the parent's own block
    alloc.ensure(3, 5 * BS)  # every free block: none of the shared ones is handed out
    assert not set(alloc.table(3)) & set(alloc.table(2))
    with pytest.raises(OutOfBlocksError):
        alloc.ensure(3, 6 * BS)
    alloc.free(3)
    alloc.free(2)
    assert alloc.num_free == 8 and alloc.sequences() == []
    assert all(alloc.refs(b) == 0 for b in range(8))


def test_freeing_the_child_first_and_truncating_release_only_unshared_holds() -> None:
    alloc = BlockAllocator(8, BS)
    alloc.ensure(1, 50)  # 4 blocks
    parent = list(alloc.table(1))
    alloc.share(1, 2, 50)  # 3 shared
    alloc.ensure(2, 60)
    assert alloc.num_free == 3
    alloc.truncate(2, 20)  # drops its own block and one shared hold
    assert alloc.table(2) == parent[:2] and alloc.num_free == 4 and alloc.refs(parent[2]) == 1
    alloc.truncate(1, 17)  # the parent lets go of blocks 2 and 3; block 1 is still the child's too
    assert alloc.num_free == 6 and [alloc.refs(b) for b in parent[:2]] == [2, 2]
    alloc.free(2)
    assert alloc.num_free == 6 and alloc.table(1) == parent[:2]
    alloc.free(1)
    assert alloc.num_free == 8 and sorted(alloc._free) == list(range(8))  # each block back once


# ----- one worker: a real drafter --------------------------------------------------------------


def spec(seq_id: int, tokens: list[int], fork_of: int | None = None) -> control_pb2.SeqSpec:
    out = control_pb2.SeqSpec(seq_id=seq_id, tokens=tokens, sampling=control_pb2.SeqSampling(temperature=0.0),
                              prompt_len=len(tokens))
    if fork_of is not None:
        out.fork_of, out.fork_tokens = fork_of, len(tokens)
    return out


def plan(step: int, add: list[control_pb2.SeqSpec], remove: tuple[int, ...] = ()) -> control_pb2.StepPlan:
    return control_pb2.StepPlan(step=step, add=add, remove=list(remove))


def blocks_content(drafter: Drafter, blocks: list[int]) -> list[torch.Tensor]:
    return [t[blocks].clone() for layer in drafter.runner.cache.layers for t in layer]


def test_a_fork_drafts_what_its_parent_drafted_without_writing_the_shared_blocks() -> None:
    drafter = Drafter(ModelRunner(load_model(TINY_DRAFT), 32, BS))
    prompt = [(5 * i) % 200 + 3 for i in range(40)]
    apply_membership(drafter, plan(0, [spec(1, prompt)]))
    parent_drafts = drafter.propose([1], 4).tokens.tolist()
    shared = drafter.runner.allocator.table(1)[:2]
    before = blocks_content(drafter, shared)
    # The parent leaves in the plan that forks it: it still lends its blocks.
    apply_membership(drafter, plan(1, [spec(2, prompt, fork_of=1), spec(3, prompt, fork_of=99)], remove=[1]))
    assert 1 not in drafter.seqs and drafter.seqs[2].cached == 32 and drafter.seqs[3].cached == 0
    assert drafter.runner.allocator.table(2)[:2] == shared and drafter.shared_tokens == 32
    assert drafter.propose([2, 3], 4).tokens.tolist() == parent_drafts * 2  # the fork and the unshared one agree
    assert all(torch.equal(a, b) for a, b in zip(before, blocks_content(drafter, shared), strict=True))
    apply_membership(drafter, plan(2, [], remove=[2, 3]))
    assert drafter.runner.allocator.num_free == 32


def test_a_fork_of_a_parent_without_the_prompt_cached_computes_it() -> None:
    drafter = Drafter(ModelRunner(load_model(TINY_DRAFT), 32, BS))
    prompt = list(range(3, 43))
    apply_membership(drafter, plan(0, [spec(1, prompt), spec(2, prompt, fork_of=1)]))  # the parent never ran
    assert drafter.seqs[2].cached == 0 and drafter.runner.allocator.table(2) == []
    apply_membership(drafter, plan(1, [spec(1, prompt)]))  # re-added: removed first, then added
    assert drafter.seqs[1].tokens == prompt and drafter.runner.allocator.num_free == 32


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


def fake_stack(words: Tokenizer) -> Stack:
    return Stack(words, ManagerConfig(mode="psd", k=2, pipeline_depth=1, draft_retry_s=0.0),
                 lambda seq_id, step: 99)


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
        cfg = ManagerConfig(mode="psd", k=3, draft_retry_s=0.2)
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
        for port in self.ports:
            wait_until(lambda port=port: worker_info(port).free_blocks == NUM_BLOCKS, timeout=30)
            assert worker_info(port).sequences == 0


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
