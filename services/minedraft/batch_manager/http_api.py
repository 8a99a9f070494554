"""OpenAI-compatible HTTP API (FastAPI) over any GenerationBackend.

Every request opens its backend stream and waits for the first chunk before answering,
so validation and queue errors become proper 400/429 responses even with stream=true.
A client that goes away closes the backend stream (which aborts the request and frees
its KV cache) in both streaming and non-streaming mode.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Send

from minedraft import __version__
from minedraft.batch_manager.backend import GenerationBackend, GenerationChunk, QueueFullError, UnavailableError
from minedraft.batch_manager.chat import chat_prompt_ids
from minedraft.batch_manager.openai_models import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessageOut,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ErrorDetail,
    ErrorResponse,
    ModelCard,
    ModelList,
    UsageInfo,
)
from minedraft.core.errors import InvalidRequestError
from minedraft.core.sampling_params import SamplingParams

T = TypeVar("T")
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict"}
_KNOWN_PARAMS = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)


class ModelNotFoundError(LookupError):
    """The request names a model this server does not serve (404, like OpenAI and vLLM)."""


class ClientDisconnectedError(Exception):
    """The HTTP client went away before the response was ready."""


# ----- errors -----


def error_response(
    status: int, message: str, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> JSONResponse:
    body = ErrorResponse(error=ErrorDetail(message=message, type=type_, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status)


def _loc_to_param(loc: tuple[Any, ...]) -> str | None:
    """("body", "messages", 0, "role") -> "messages[0].role"; drops pydantic's union-member tags."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier() and part not in _UNION_TAGS:
            out += f".{part}" if out else part
    return out or None


def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request", "type": ""}
    param = _loc_to_param(tuple(first.get("loc", ())))
    if first.get("type") == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    elif first.get("type") == "json_invalid":
        message, param = f"request body is not valid JSON: {first.get('ctx', {}).get('error', '')}", None
    else:
        message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    return error_response(400, message, param=param)


def _invalid_request(request: Request, exc: InvalidRequestError) -> JSONResponse:
    """The engine's messages start with the field they are about; expose it as `param`."""
    match = re.match(r"[a-z_]+", str(exc))
    param = match.group(0) if match and match.group(0) in _KNOWN_PARAMS else None
    if param == "prompt" and request.url.path.endswith("/chat/completions"):
        param = "messages"
    return error_response(400, str(exc), param=param)


def install_error_handlers(app: FastAPI) -> None:
    handlers: dict[type[Exception], Callable[[Request, Any], JSONResponse]] = {
        RequestValidationError: _validation_error,
        InvalidRequestError: _invalid_request,
        QueueFullError: lambda _r, e: error_response(429, str(e), "rate_limit_error", code="rate_limit_exceeded"),
        UnavailableError: lambda _r, e: error_response(503, str(e), "service_unavailable", code="unavailable"),
        ModelNotFoundError: lambda _r, e: error_response(404, str(e), param="model", code="model_not_found"),
        StarletteHTTPException: lambda _r, e: error_response(e.status_code, str(e.detail)),
        ClientDisconnectedError: lambda _r, _e: error_response(499, "client closed the request"),
    }
    for exc_type, handler in handlers.items():
        app.add_exception_handler(exc_type, handler)


# ----- streams -----


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


async def open_stream(
    request: Request, backend: GenerationBackend, prompt_ids: list[int], params: SamplingParams, request_id: str
) -> AsyncIterator[GenerationChunk]:
    """Start a request and wait for its first chunk, so errors surface before any response is sent.

    Returns the whole stream (first chunk included) up to the chunk with a finish_reason.
    """
    stream = backend.generate(prompt_ids, params, request_id)
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


# ----- app -----

EventsFn = Callable[[AsyncIterator[GenerationChunk], str, str, bool], AsyncIterator[str]]
BodyFn = Callable[[str, str, list[GenerationChunk]], BaseModel]


class OpenAIServer:
    """Route handlers bound to one backend."""

    def __init__(self, backend: GenerationBackend) -> None:
        self.backend = backend

    def check_model(self, model: str | None) -> None:
        if model and model != self.backend.model_name:
            raise ModelNotFoundError(
                f"The model `{model}` does not exist; this server serves `{self.backend.model_name}`"
            )

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        self.check_model(body.model)
        body.check_supported()
        prompt = body.single_prompt()
        ids = self.backend.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        return await self._serve(request, body, ids, max_tokens, "cmpl", completion_events, completion_body)

    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Response:
        self.check_model(body.model)
        body.check_supported()
        ids = chat_prompt_ids(self.backend.tokenizer, body.messages)
        max_tokens = body.requested_max_tokens
        if max_tokens is None:  # OpenAI: as much as the context allows
            max_tokens = max(1, self.backend.max_context - len(ids))
        return await self._serve(request, body, ids, max_tokens, "chatcmpl", chat_events, chat_body)

    async def _serve(
        self,
        request: Request,
        body: CompletionRequest | ChatCompletionRequest,
        ids: list[int],
        max_tokens: int,
        id_prefix: str,
        events: EventsFn,
        build: BodyFn,
    ) -> Response:
        request_id = f"{id_prefix}-{uuid.uuid4().hex}"
        model = self.backend.model_name
        chunks = await open_stream(request, self.backend, ids, body.sampling_params(max_tokens), request_id)
        if body.stream:
            return sse_response(events(chunks, request_id, model, body.wants_usage_in_stream))
        collected = await race_disconnect(request, collect(chunks))
        return JSONResponse(build(request_id, model, collected).model_dump())


def install_health_route(app: FastAPI, backend: GenerationBackend) -> None:
    """GET /health: 200 with the backend's status (mode, batches, counters, draft link)."""

    @app.get("/health")
    async def health() -> dict[str, object]:
        return {"status": "ok", **backend.status()}


def build_http_app(backend: GenerationBackend, serve_health: bool = True) -> FastAPI:
    """The FastAPI app: /v1/completions, /v1/chat/completions, /v1/models and (unless an admin
    port serves it) /health."""
    app = FastAPI(title="minedraft", version=__version__)
    app.state.backend = backend
    server = OpenAIServer(backend)
    install_error_handlers(app)
    if serve_health:
        install_health_route(app, backend)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return ModelList(data=[ModelCard(id=backend.model_name, max_model_len=backend.max_context)]).model_dump()

    app.add_api_route("/v1/completions", server.completions, methods=["POST"], response_model=None)
    app.add_api_route("/v1/chat/completions", server.chat_completions, methods=["POST"], response_model=None)
    return app
