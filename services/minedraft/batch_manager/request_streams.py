"""Where each request's output goes: one queue per request between the step loop and its API call.

The loop puts chunks (or the exception that ends the request) on the queue of the request's
current sequence id; the API call reads them in order. A preempted request changes sequence
id, and its queue moves with it. A caller that wants only the finished output (`partial` False)
gets one chunk: the loop does not build, queue and hand on a chunk per step for it (at 64 sequences
those were a fifth of the batch manager's CPU, measured with unary gRPC clients). A streaming
caller's chunk waits for `stream_interval` new tokens (vLLM's --stream-interval), except its first
(time to first token) and its last: each chunk is one gRPC write or SSE event, the largest part of
the manager's CPU per token when many requests stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from minedraft.batch_manager.backend import GenerationChunk
from minedraft.core.request import Request


class RequestStreams:
    def __init__(self, stream_interval: int = 1) -> None:
        self.stream_interval = stream_interval
        self._queues: dict[int, asyncio.Queue[GenerationChunk | Exception]] = {}
        self._final_only: set[int] = set()  # sequence ids whose caller wants one chunk, at the end

    def open(self, req: Request, partial: bool = True) -> asyncio.Queue[GenerationChunk | Exception]:
        queue: asyncio.Queue[GenerationChunk | Exception] = asyncio.Queue()
        self._queues[req.req_id] = queue
        if not partial:
            self._final_only.add(req.req_id)
        return queue

    @staticmethod
    async def read(queue: asyncio.Queue[GenerationChunk | Exception]) -> AsyncIterator[GenerationChunk]:
        """Chunks until one carries a finish reason; an exception put instead is raised."""
        while True:
            chunk = await queue.get()
            if isinstance(chunk, Exception):
                raise chunk
            yield chunk
            if chunk.finish_reason is not None:
                return

    def close(self, req: Request) -> None:
        self._queues.pop(req.req_id, None)
        self._final_only.discard(req.req_id)

    def notify(self, req: Request) -> None:
        """What `req` produced since its last chunk, if anything."""
        queue = self._queues.get(req.req_id)
        if queue is None:
            return
        if not req.finished and (req.req_id in self._final_only or self._holding(req)):
            return
        chunk = GenerationChunk.take_from(req)
        if chunk is not None:
            queue.put_nowait(chunk)

    def _holding(self, req: Request) -> bool:
        """A started stream waits until `stream_interval` tokens are new."""
        started = req.unsent_tokens < len(req.output_ids)  # its first chunk went out
        return self.stream_interval > 1 and started and req.unsent_tokens < self.stream_interval

    def fail(self, req: Request, exc: Exception) -> None:
        queue = self._queues.get(req.req_id)
        if queue is not None:
            queue.put_nowait(exc)

    def renamed(self, old_id: int, new_id: int) -> None:
        queue = self._queues.pop(old_id, None)
        if queue is not None:
            self._queues[new_id] = queue
        if old_id in self._final_only:
            self._final_only.discard(old_id)
            self._final_only.add(new_id)
