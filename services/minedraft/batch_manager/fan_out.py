"""One API request as several backend generations: batch prompts, n > 1 and best_of.

Each generation is its own backend request; those of one prompt share a `share_prompt` key (the API request's
id and the prompt's index), so a backend may compute the prompt's KV once. With a seed, candidate i of a prompt
samples with seed + i (so n=3 seeded s equals three requests seeded s, s+1, s+2); without one, each draws its
own. All are opened before the response starts (so any error is a proper status code) and end together:
closing the merged stream, or the failure of one, closes (aborts) every other (choices.py's interleaving,
which knows no protocol).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass

from fastapi import Request

from minedraft.batch_manager.backend import GenerationBackend, GenerationChunk
from minedraft.batch_manager.choices import child_params, close_all, interleave
from minedraft.batch_manager.http_streams import race_disconnect
from minedraft.core.sampling_params import SamplingParams

Chunks = AsyncIterator[GenerationChunk]


@dataclass(frozen=True, slots=True)
class Generation:
    """One backend request of an API request: candidate `candidate` of prompt `prompt_index`."""

    prompt_index: int
    candidate: int
    prompt_ids: list[int]
    params: SamplingParams
    request_id: str
    share_prompt: str | None


def plan_generations(request_id: str, prompts: Sequence[list[int]], params: SamplingParams, candidates: int,
                     rank_by_logprob: bool = False) -> list[Generation]:
    """Generations in choice order: prompt by prompt, `candidates` each; a single one keeps the request's id."""
    if len(prompts) == 1 and candidates == 1:
        return [Generation(0, 0, list(prompts[0]), params, request_id, None)]
    out = []
    for p, ids in enumerate(prompts):
        share = f"{request_id}-p{p}" if candidates > 1 else None
        for i, child in enumerate(child_params(params, candidates, rank_by_logprob, prompt_logprobs_to_all=True)):
            out.append(Generation(p, i, list(ids), child, f"{request_id}-{p * candidates + i}", share))
    return out


def best_candidates(per_generation: Sequence[list[GenerationChunk]], candidates: int, n: int
                    ) -> list[list[GenerationChunk]]:
    """Per prompt, the n of its `candidates` generations with the highest cumulative logprob, best first
    (ties keep their order); with candidates == n, all of them as they are."""
    out: list[list[GenerationChunk]] = []
    for start in range(0, len(per_generation), candidates):
        group = list(per_generation[start:start + candidates])
        if candidates > n:
            group = sorted(group, key=lambda chunks: chunks[-1].cumulative_logprob, reverse=True)[:n]
        out.extend(group)
    return out


class FanOut:
    """The opened streams of one API request, each with its first chunk; closing it aborts all of them."""

    def __init__(self, streams: list[Chunks], raw: list[Chunks], firsts: list[GenerationChunk]) -> None:
        self._streams = streams
        self._raw = raw  # the backend's own streams, in case a wrapper never started (it could not close them)
        self._firsts = firsts

    @classmethod
    async def open(cls, request: Request, backend: GenerationBackend, generations: Sequence[Generation],
                   deadline: float | None, partial: bool, wrap: Callable[[Generation, Chunks], Chunks]) -> FanOut:
        """Start every generation and wait for each one's first chunk (a client that leaves meanwhile cancels
        them all); the first error closes every stream started and is raised."""
        raw: list[Chunks] = []
        streams: list[Chunks] = []
        tasks: list[asyncio.Future[GenerationChunk]] = []

        async def first_chunks() -> list[GenerationChunk]:
            tasks.extend(asyncio.ensure_future(anext(s)) for s in streams)
            return list(await asyncio.gather(*tasks))

        try:
            for g in generations:
                raw.append(backend.generate(g.prompt_ids, g.params, g.request_id, deadline, partial, g.share_prompt))
                streams.append(wrap(g, raw[-1]))
            firsts = await race_disconnect(request, first_chunks())
        except BaseException:
            await _settle(tasks)
            await close_all([*streams, *raw])
            raise
        return cls(streams, raw, firsts)

    async def aclose(self) -> None:
        await close_all([*self._streams, *self._raw])

    async def merged(self) -> AsyncIterator[tuple[int, GenerationChunk]]:
        """Every generation's chunks as they come, each with its generation's index, until all have finished.
        A generation's error is raised at once; closing this early or failing closes every stream."""
        try:
            async with aclosing(interleave([_resumed(f, s) for f, s in zip(self._firsts, self._streams,
                                                                           strict=True)])) as chunks:
                async for item in chunks:
                    yield item
        finally:
            await self.aclose()

    async def collect(self) -> list[list[GenerationChunk]]:
        """All chunks of every generation, by generation."""
        per_generation: list[list[GenerationChunk]] = [[] for _ in self._streams]
        async with aclosing(self.merged()) as chunks:
            async for i, chunk in chunks:
                per_generation[i].append(chunk)
        return per_generation


async def _resumed(first: GenerationChunk, stream: Chunks) -> Chunks:
    """A stream whose first chunk was already read, whole again, up to its finishing chunk."""
    yield first
    chunk = first
    while chunk.finish_reason is None:
        chunk = await anext(stream)
        yield chunk


async def _settle(tasks: Sequence[asyncio.Future[GenerationChunk]]) -> None:
    """Cancel and await `tasks`, so no stream is still running one when it is closed."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
