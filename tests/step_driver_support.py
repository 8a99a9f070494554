"""Running the batch manager's real Coordinator over the fake worker links, and reading its plans."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from minedraft.batch_manager.backend import GenerationChunk
from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.batch_manager.step_driver import StepDriver
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.proto import control_pb2
from tests.fake_worker_links import EOS, VOCAB, FakeDraft, FakeVerifier, FakeWorkerLink, fake_pair


def word_tokenizer(folder: Path) -> Tokenizer:
    """Words "w0".."w63", one per id, so text and ids map one to one."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = HFTokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": f"w{EOS}"}))
    return Tokenizer(folder)


@dataclass(frozen=True)
class Plan:
    """A StepPlan as the tests spell it: which sequences draft, which are verified, who joins or leaves."""

    step: int
    draft: tuple[int, ...] = ()
    verify: tuple[int, ...] = ()
    add: tuple[int, ...] = ()
    remove: tuple[int, ...] = ()
    k: int = 2
    drafts: bool = True  # with_drafts
    to_draft: bool = True  # send_verdict: the draft service is in the loop


def summary(p: control_pb2.StepPlan) -> Plan:
    return Plan(p.step, tuple(p.draft_batch), tuple(p.verify_batch), tuple(a.seq_id for a in p.add),
                tuple(p.remove), p.k, p.with_drafts, p.send_verdict)


class Stack:
    """A Coordinator started over a fake verifier and (unless `accept` is None) a fake draft service."""

    def __init__(self, tokenizer: Tokenizer, config: ManagerConfig, accept: Callable[[int, int], int] | None) -> None:
        self.verifier: FakeVerifier
        self.draft: FakeDraft | None
        self.verifier, self.draft = fake_pair(accept)
        self.coordinator = Coordinator(tokenizer, "fake", self.verifier, self.draft, config)

    @property
    def driver(self) -> StepDriver:
        return self.coordinator.driver

    def plans(self, worker: FakeWorkerLink | None = None) -> list[Plan]:
        return [summary(p) for p in (worker or self.verifier).plans]

    def stream(self, prompt: list[int], max_tokens: int, **params: object) -> AsyncIterator[GenerationChunk]:
        sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params)  # type: ignore[arg-type]
        return self.coordinator.generate(prompt, sampling, "test")

    async def run(self, prompt: list[int], max_tokens: int) -> list[int]:
        """A whole request: its output token ids."""
        out: list[int] = []
        async with aclosing(self.stream(prompt, max_tokens)) as chunks:
            async for chunk in chunks:
                out += chunk.token_ids
        return out

    async def settle(self, turns: int = 200) -> None:
        """Let the loop run until nothing is in flight and nothing is left to plan."""
        for _ in range(turns):
            await asyncio.sleep(0)
        d = self.driver
        assert d.in_flight == 0 and not d.pending_remove and not d.sched.seqs, "the loop did not settle"


def drive(scenario: Callable[[], Coroutine[None, None, None]], timeout_s: float = 20.0) -> None:
    """Run one test scenario; a loop that stalls fails the test instead of hanging it."""
    asyncio.run(asyncio.wait_for(scenario(), timeout_s))


async def until(predicate: Callable[[], bool], turns: int = 1000) -> None:
    """Let other tasks run until `predicate` holds (no wall-clock waiting: everything is in memory)."""
    for _ in range(turns):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")
