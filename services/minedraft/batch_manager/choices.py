"""One API request as several backend requests (the n choices, or the best_of candidates) and back, for both
APIs.

Nothing here knows gRPC or HTTP: children are plain chunk streams. Their chunks are interleaved
as they come; closing the interleaving, or any child failing, closes every child, which is what
aborts the others' requests and frees their KV cache (a cancelled call must not leave n - 1 requests
decoding for nobody).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

from minedraft.batch_manager.backend import GenerationChunk
from minedraft.core.errors import InvalidRequestError
from minedraft.core.logprobs import TokenLogprob
from minedraft.core.sampling_params import SamplingParams

T = TypeVar("T")
MAX_CHOICES = 128  # n and best_of, as OpenAI's bound on n


@dataclasses.dataclass(frozen=True, slots=True)
class FanOut:
    """How many children to run (`best_of`) and how many of them to return (`n`)."""

    n: int = 1
    best_of: int = 1

    @classmethod
    def of(cls, n: int, best_of: int, streaming: bool) -> FanOut:
        """From the request's fields (0: unset); InvalidRequestError names the field out of range."""
        n = n or 1
        best_of = best_of or n
        if not 1 <= n <= MAX_CHOICES:
            raise InvalidRequestError(f"n must be in [1, {MAX_CHOICES}], got {n}", param="n")
        if not n <= best_of <= MAX_CHOICES:
            raise InvalidRequestError(f"best_of must be in [n={n}, {MAX_CHOICES}], got {best_of}", param="best_of")
        if streaming and best_of > n:
            raise InvalidRequestError("best_of cannot be used when streaming (the best candidates are known "
                                      "only at the end); use Generate", param="best_of")
        return cls(n, best_of)

    @property
    def ranks(self) -> bool:
        return self.best_of > self.n

    def child_params(self, params: SamplingParams) -> list[SamplingParams]:
        """One copy per child; prompt logprobs on child 0 only (the prompt is the same for all)."""
        return child_params(params, self.best_of, self.ranks, prompt_logprobs_to_all=False)


def child_params(params: SamplingParams, count: int, rank_by_logprob: bool, prompt_logprobs_to_all: bool
                 ) -> list[SamplingParams]:
    """`count` copies of `params`: seeds s, s + 1, ... when seeded; logprobs on (at least the chosen token's)
    when candidates are ranked, their cumulative logprob being the score; prompt logprobs on every child or on
    child 0 alone."""
    children = []
    for i in range(count):
        child = dataclasses.replace(params, stop=list(params.stop), stop_token_ids=list(params.stop_token_ids),
                                    logit_bias=dict(params.logit_bias))
        if params.seed is not None:
            child.seed = params.seed + i
        if rank_by_logprob and child.logprobs is None:
            child.logprobs = 0
        if i and not prompt_logprobs_to_all:
            child.prompt_logprobs = None
        children.append(child)
    return children


@dataclasses.dataclass(slots=True)
class Collected:
    """All the output of one child, gathered from its chunks."""

    index: int
    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[TokenLogprob] = dataclasses.field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finish_reason: str = ""
    cumulative_logprob: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, chunk: GenerationChunk) -> None:
        self.text += chunk.text
        self.token_ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs or ())
        if chunk.prompt_logprobs is not None:
            self.prompt_logprobs = chunk.prompt_logprobs
        self.finish_reason = chunk.finish_reason or ""
        self.cumulative_logprob = chunk.cumulative_logprob
        self.prompt_tokens = chunk.prompt_tokens
        self.completion_tokens = chunk.completion_tokens


def best(candidates: Sequence[Collected], n: int) -> list[Collected]:
    """The n candidates with the highest cumulative logprob, best first (ties: the lower index first)."""
    return sorted(candidates, key=lambda c: (-c.cumulative_logprob, c.index))[:n]


async def collect(streams: Sequence[AsyncIterator[GenerationChunk]]) -> list[Collected]:
    """Every child's whole output, in child order."""
    out = [Collected(i) for i in range(len(streams))]
    merged = interleave(streams)
    try:
        async for i, chunk in merged:
            out[i].add(chunk)
    finally:
        await merged.aclose()
    return out


async def interleave(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """(child index, item) as each child produces it, until every child ends. Closing this generator or a
    child raising closes every child (the error is re-raised)."""
    pending: dict[asyncio.Task[T], int] = {}

    def pull(i: int) -> None:
        pending[asyncio.ensure_future(_next(streams[i]))] = i

    try:
        for i in range(len(streams)):
            pull(i)
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=pending.__getitem__):
                i = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                yield i, item
                pull(i)
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)  # also retrieves the others' errors
        await close_all(streams)


async def close_all(streams: Sequence[AsyncIterator[object]]) -> None:
    """aclose() each stream that has one (a backend stream's close aborts its request); idempotent."""
    for stream in streams:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


async def _next(stream: AsyncIterator[T]) -> T:
    return await anext(stream)
