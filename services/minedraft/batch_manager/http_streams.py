"""Streaming pieces of the OpenAI HTTP API: backend chunks to server-sent events or one body.

Every request opens its backend stream and waits for the first chunk before answering (so
errors become proper status codes); a client that leaves closes the backend stream, which
aborts the request and frees its KV cache, while waiting and mid-stream alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from typing import TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Send

from minedraft.batch_manager.backend import GenerationChunk
from minedraft.batch_manager.openai_models import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessageOut,
    CompletionChoice,
    CompletionResponse,
    ErrorDetail,
    ErrorResponse,
    UsageInfo,
)

T = TypeVar("T")


class ClientDisconnectedError(Exception):
    """The HTTP client went away before the response was ready."""


def sse(payload: BaseModel) -> str:
    return f"data: {payload.model_dump_json()}\n\n"


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def race_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (so its stream closes and the request aborts) if the client leaves first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watcher):
            t.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnectedError
    return task.result()


async def open_stream(request: Request, stream: AsyncIterator[GenerationChunk]) -> AsyncIterator[GenerationChunk]:
    """Start a request's backend stream and wait for its first chunk, so errors surface before any
    response is sent. Returns the whole stream (first chunk included) up to the finishing chunk.
    """
    try:
        first = await race_disconnect(request, anext(stream))
    except BaseException:
        await stream.aclose()  # type: ignore[attr-defined]
        raise
    return _chunks_from(first, stream)


async def _chunks_from(
    first: GenerationChunk, stream: AsyncIterator[GenerationChunk]
) -> AsyncIterator[GenerationChunk]:
    async with aclosing(stream):  # type: ignore[type-var]
        chunk = first
        yield chunk
        while chunk.finish_reason is None:
            chunk = await anext(stream)
            yield chunk


async def collect(chunks: AsyncIterator[GenerationChunk]) -> list[GenerationChunk]:
    async with aclosing(chunks):  # type: ignore[type-var]
        return [chunk async for chunk in chunks]


class ClosingStreamingResponse(StreamingResponse):
    """Closes the body generator even when a disconnect cancels the send loop mid-stream."""

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


async def guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Once headers are sent an error can only be reported in-band: an error event, then [DONE]."""
    async with aclosing(events):  # type: ignore[type-var]
        try:
            async for event in events:
                yield event
        except Exception as exc:
            yield sse(ErrorResponse(error=ErrorDetail(message=str(exc), type="server_error")))
            yield "data: [DONE]\n\n"


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return ClosingStreamingResponse(guarded(events), media_type="text/event-stream", headers=headers)


async def completion_events(
    chunks: AsyncIterator[GenerationChunk], request_id: str, model: str, include_usage: bool
) -> AsyncIterator[str]:
    last: GenerationChunk | None = None
    async with aclosing(chunks):  # type: ignore[type-var]
        async for chunk in chunks:
            last = chunk
            if chunk.text or chunk.finish_reason:
                choice = CompletionChoice(text=chunk.text, finish_reason=chunk.finish_reason)
                yield sse(CompletionResponse(id=request_id, model=model, choices=[choice]))
    if include_usage and last is not None:
        usage = UsageInfo.of(last.prompt_tokens, last.completion_tokens)
        yield sse(CompletionResponse(id=request_id, model=model, choices=[], usage=usage))
    yield "data: [DONE]\n\n"


async def chat_events(
    chunks: AsyncIterator[GenerationChunk], request_id: str, model: str, include_usage: bool
) -> AsyncIterator[str]:
    def event(delta: ChatDelta, finish_reason: str | None = None) -> str:
        choice = ChatChunkChoice(delta=delta, finish_reason=finish_reason)
        return sse(ChatCompletionChunk(id=request_id, model=model, choices=[choice]))

    last: GenerationChunk | None = None
    yield event(ChatDelta(role="assistant", content=""))
    async with aclosing(chunks):  # type: ignore[type-var]
        async for chunk in chunks:
            last = chunk
            if chunk.text:
                yield event(ChatDelta(content=chunk.text))
            if chunk.finish_reason:
                yield event(ChatDelta(), chunk.finish_reason)
    if include_usage and last is not None:
        usage = UsageInfo.of(last.prompt_tokens, last.completion_tokens)
        yield sse(ChatCompletionChunk(id=request_id, model=model, choices=[], usage=usage))
    yield "data: [DONE]\n\n"


def completion_body(request_id: str, model: str, chunks: list[GenerationChunk]) -> CompletionResponse:
    last = chunks[-1]
    choice = CompletionChoice(text="".join(c.text for c in chunks), finish_reason=last.finish_reason)
    usage = UsageInfo.of(last.prompt_tokens, last.completion_tokens)
    return CompletionResponse(id=request_id, model=model, choices=[choice], usage=usage)


def chat_body(request_id: str, model: str, chunks: list[GenerationChunk]) -> ChatCompletionResponse:
    last = chunks[-1]
    message = ChatMessageOut(content="".join(c.text for c in chunks))
    usage = UsageInfo.of(last.prompt_tokens, last.completion_tokens)
    return ChatCompletionResponse(
        id=request_id, model=model, choices=[ChatChoice(message=message, finish_reason=last.finish_reason)], usage=usage
    )
