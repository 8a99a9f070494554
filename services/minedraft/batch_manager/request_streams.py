"""Where each request's output goes: one queue per request between the step loop and its API call.

The loop puts chunks (or the exception that ends the request) on the queue of the request's
current sequence id; the API call reads them in order. A preempted request changes sequence
id, and its queue moves with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from minedraft.batch_manager.backend import GenerationChunk
from minedraft.core.request import Request


class RequestStreams:
    def __init__(self) -> None:
        self._queues: dict[int, asyncio.Queue[GenerationChunk | Exception]] = {}

    def open(self, req: Request) -> asyncio.Queue[GenerationChunk | Exception]:
        queue: asyncio.Queue[GenerationChunk | Exception] = asyncio.Queue()
        self._queues[req.req_id] = queue
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

    def notify(self, req: Request) -> None:
        """What `req` produced since its last chunk, if anything."""
        queue = self._queues.get(req.req_id)
        chunk = GenerationChunk.take_from(req)
        if queue is not None and chunk is not None:
            queue.put_nowait(chunk)

    def fail(self, req: Request, exc: Exception) -> None:
        queue = self._queues.get(req.req_id)
        if queue is not None:
            queue.put_nowait(exc)

    def renamed(self, old_id: int, new_id: int) -> None:
        queue = self._queues.pop(old_id, None)
        if queue is not None:
            self._queues[new_id] = queue
