"""Streaming pieces of the OpenAI HTTP API: generations' chunks to server-sent events or one body.

Every request opens its backend streams and waits for their first chunks before answering (fan_out.py, so
errors become proper status codes); a client that leaves closes them, which aborts the generations and frees
their KV cache, while waiting and mid-stream alike. With several choices (batch prompts, n > 1) the chunks of
all choices are interleaved as they come, each event naming its choice's `index`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Send

from minedraft.batch_manager.assistant_output import AssistantMessage
from minedraft.batch_manager.backend import GenerationChunk
from minedraft.batch_manager.choice_output import ChoiceState, OutputOptions, join_chat_logprobs, join_completion
from minedraft.batch_manager.openai_responses import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatMessageOut,
    CompletionChoice,
    CompletionResponse,
    ErrorDetail,
    ErrorResponse,
    FunctionCallOut,
    FunctionDelta,
    ToolCallDeltaOut,
    ToolCallOut,
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


class ClosingStreamingResponse(StreamingResponse):
    """Closes the body generator even when a disconnect cancels the send loop mid-stream, and then calls
    `on_close` (which closes the generations even if the body never started, so could not close them)."""

    def __init__(self, *args: Any, on_close: Callable[[], Awaitable[None]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_close = on_close

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            if self.on_close is not None:
                await self.on_close()


async def guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Once headers are sent an error can only be reported in-band: an error event, then [DONE]."""
    async with aclosing(events):  # type: ignore[type-var]
        try:
            async for event in events:
                yield event
        except Exception as exc:
            yield sse(ErrorResponse(error=ErrorDetail(message=str(exc), type="server_error")))
            yield "data: [DONE]\n\n"


def sse_response(events: AsyncIterator[str], on_close: Callable[[], Awaitable[None]] | None = None
                 ) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return ClosingStreamingResponse(guarded(events), media_type="text/event-stream", headers=headers,
                                    on_close=on_close)




Indexed = AsyncIterator[tuple[int, GenerationChunk]]  # (choice index, chunk), as FanOut.merged gives them


@dataclass(frozen=True, slots=True)
class StreamSettings:
    request_id: str
    model: str
    include_usage: bool = False
    continuous_usage: bool = False  # vLLM: every chunk carries its choice's usage so far


def _totals(states: dict[int, ChoiceState], options: OutputOptions) -> UsageInfo:
    prompts = {i // options.per_prompt: s.prompt_tokens for i, s in sorted(states.items())}
    return options.usage(prompts, {i: s.completion_tokens for i, s in states.items()})


async def completion_events(chunks: Indexed, options: OutputOptions, settings: StreamSettings
                            ) -> AsyncIterator[str]:
    states: dict[int, ChoiceState] = {}

    def event(choices: list[CompletionChoice], usage: UsageInfo | None = None) -> str:
        return sse(CompletionResponse(id=settings.request_id, model=settings.model, choices=choices, usage=usage))

    async with aclosing(chunks):  # type: ignore[type-var]
        async for i, chunk in chunks:
            state = states.setdefault(i, ChoiceState.of(options, i))
            choice = state.completion_piece(chunk, i)
            if choice.text or choice.finish_reason or choice.prompt_logprobs or (choice.logprobs and
                                                                                  choice.logprobs.tokens):
                usage = UsageInfo.of(state.prompt_tokens, state.completion_tokens) if settings.continuous_usage \
                    else None
                yield event([choice], usage)
    if settings.include_usage and states:
        yield event([], _totals(states, options))
    yield "data: [DONE]\n\n"


async def chat_events(chunks: Indexed, options: OutputOptions, settings: StreamSettings) -> AsyncIterator[str]:
    states: dict[int, ChoiceState] = {}

    def event(i: int, delta: ChatDelta, logprobs: ChatLogprobs | None = None, finish_reason: str | None = None
              ) -> str:
        state = states[i]
        usage = UsageInfo.of(state.prompt_tokens, state.completion_tokens) if settings.continuous_usage else None
        choice = ChatChunkChoice(index=i, delta=delta, logprobs=logprobs, finish_reason=finish_reason)
        return sse(ChatCompletionChunk(id=settings.request_id, model=settings.model, choices=[choice], usage=usage))

    async with aclosing(chunks):  # type: ignore[type-var]
        async for i, chunk in chunks:
            if i not in states:
                states[i] = ChoiceState.of(options, i)
                yield event(i, ChatDelta(role="assistant", content=""))
            state = states[i]
            text = state.take(chunk)
            logprobs = state.chat_logprobs(chunk)
            deltas = chat_deltas(state, text, chunk.finish_reason is not None)
            if not deltas and logprobs and logprobs.content:
                deltas = [ChatDelta(content="")]
            for n, delta in enumerate(deltas):
                yield event(i, delta, None if n else logprobs)
            if state.finish_reason is not None:
                reason = state.assistant.finish_reason(state.finish_reason) if state.assistant else state.finish_reason
                yield event(i, ChatDelta(), finish_reason=reason)
    if settings.include_usage and states:
        yield sse(ChatCompletionChunk(id=settings.request_id, model=settings.model, choices=[],
                                      usage=_totals(states, options)))
    yield "data: [DONE]\n\n"


def chat_deltas(state: ChoiceState, text: str, final: bool) -> list[ChatDelta]:
    """The deltas a chunk's text makes: as it is, or read as reasoning, content and tool calls (one delta
    each, so a call's header comes before its arguments)."""
    if state.assistant is None:
        return [ChatDelta(content=text)] if text else []
    piece = state.assistant.feed(text, final)
    out = [ChatDelta(reasoning_content=piece.reasoning)] if piece.reasoning else []
    if piece.content:
        out.append(ChatDelta(content=piece.content))
    for d in piece.tool_calls:
        header = d.id is not None
        function = FunctionDelta(name=d.name, arguments="") if header else FunctionDelta(arguments=d.arguments)
        out.append(ChatDelta(tool_calls=[ToolCallDeltaOut(index=d.index, id=d.id, type="function" if header else None,
                                                          function=function)]))
    return out


def assistant_message(message: AssistantMessage) -> ChatMessageOut:
    calls = [ToolCallOut(id=c.id, function=FunctionCallOut(name=c.name, arguments=c.arguments))
             for c in message.tool_calls]
    return ChatMessageOut(content=message.content, reasoning_content=message.reasoning, tool_calls=calls or None)


def _choice_states(choices: Sequence[list[GenerationChunk]], options: OutputOptions) -> list[ChoiceState]:
    return [ChoiceState.of(options, i) for i in range(len(choices))]


def completion_body(settings: StreamSettings, options: OutputOptions, choices: Sequence[list[GenerationChunk]]
                    ) -> CompletionResponse:
    """`choices`: each choice's chunks, in choice order."""
    states = _choice_states(choices, options)
    out = [join_completion([state.completion_piece(c, i) for c in chunks], i)
           for i, (state, chunks) in enumerate(zip(states, choices, strict=True))]
    return CompletionResponse(id=settings.request_id, model=settings.model, choices=out,
                              usage=_totals(dict(enumerate(states)), options))


def chat_body(settings: StreamSettings, options: OutputOptions, choices: Sequence[list[GenerationChunk]]
              ) -> ChatCompletionResponse:
    states = _choice_states(choices, options)
    out = []
    for i, (state, chunks) in enumerate(zip(states, choices, strict=True)):
        texts, logprobs = [], []
        for chunk in chunks:
            texts.append(state.take(chunk))
            logprobs.append(state.chat_logprobs(chunk))
        message, reason = ChatMessageOut(content="".join(texts)), state.finish_reason
        if state.assistant is not None:
            state.assistant.feed(message.content or "", final=True)
            message, reason = assistant_message(state.assistant.message()), state.assistant.finish_reason(reason, True)
        out.append(ChatChoice(index=i, message=message, logprobs=join_chat_logprobs(logprobs), finish_reason=reason))
    prompt_logprobs = states[0].prompt_logprobs if states else None
    return ChatCompletionResponse(id=settings.request_id, model=settings.model, choices=out,
                                  usage=_totals(dict(enumerate(states)), options), prompt_logprobs=prompt_logprobs)
