"""OpenAI-compatible HTTP API (FastAPI) over any GenerationBackend: routes and error mapping.

Every request opens its backend stream and waits for the first chunk before answering
(`http_streams`), so validation and queue errors become proper 400/429 responses even with
stream=true. A client that goes away closes the backend stream (which aborts the request
and frees its KV cache) in both streaming and non-streaming mode.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from minedraft import __version__
from minedraft.batch_manager.api_keys import ApiKeys
from minedraft.batch_manager.backend import (
    GenerationBackend,
    GenerationChunk,
    QueueFullError,
    RequestTimeoutError,
    RetryLaterError,
    UnavailableError,
)
from minedraft.batch_manager.http_guards import DEFAULT_MAX_REQUEST_BYTES, ApiKeyGuard, BodyLimit, BodyTooLargeError
from minedraft.batch_manager.http_streams import (
    ClientDisconnectedError,
    chat_body,
    chat_events,
    collect,
    completion_body,
    completion_events,
    open_stream,
    race_disconnect,
    sse_response,
)
from minedraft.batch_manager.openai_models import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    ErrorDetail,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from minedraft.batch_manager.prompt_ids import chat_ids, encode_prompt
from minedraft.batch_manager.request_tracing import traced_stream
from minedraft.core.errors import InvalidRequestError
from minedraft.observability.tracing import RequestTracer

_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict"}
_KNOWN_PARAMS = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
OPEN_PATHS = frozenset({"/health", "/health/live", "/metrics"})  # probes and scrapers need no API key


class ModelNotFoundError(LookupError):
    """The request names a model this server does not serve (404, like OpenAI and vLLM)."""


# ----- errors -----


def error_response(
    status: int, message: str, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorDetail(message=message, type=type_, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _retry_later(status: int, type_: str, code: str) -> Callable[[Request, RetryLaterError], JSONResponse]:
    def handler(_request: Request, exc: RetryLaterError) -> JSONResponse:
        return error_response(status, str(exc), type_, code=code, headers={"Retry-After": str(exc.retry_after_s)})

    return handler


def _required_field(request: Request) -> str:
    return "messages" if request.url.path.endswith("/chat/completions") else "prompt"


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
    kind = first.get("type")
    if kind == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    elif kind == "json_invalid":
        message, param = f"request body is not valid JSON: {first.get('ctx', {}).get('error', '')}", None
    elif param is None and kind == "missing":  # no body at all
        param = _required_field(request)
        message = f"request body is empty: send a JSON object with at least `{param}`"
    elif param is None:  # a body that is not a JSON object (text/plain, a list, a number...)
        message = (f"request body must be a JSON object with at least `{_required_field(request)}`, sent as "
                   f"Content-Type: application/json (got {request.headers.get('content-type') or 'no content type'})")
    else:
        message = f"{param}: {first.get('msg')}"
    return error_response(400, message, param=param)


def _invalid_request(request: Request, exc: InvalidRequestError) -> JSONResponse:
    """The field the error names (or, failing that, the one its message starts with) is `param`."""
    match = re.match(r"[a-z_]+", str(exc))
    param = exc.param or (match.group(0) if match and match.group(0) in _KNOWN_PARAMS else None)
    if param == "prompt" and request.url.path.endswith("/chat/completions"):
        param = "messages"
    return error_response(400, str(exc), param=param)


def install_error_handlers(app: FastAPI) -> None:
    handlers: dict[type[Exception], Callable[[Request, Any], JSONResponse]] = {
        RequestValidationError: _validation_error,
        InvalidRequestError: _invalid_request,
        QueueFullError: _retry_later(429, "rate_limit_error", "rate_limit_exceeded"),
        UnavailableError: _retry_later(503, "service_unavailable", "unavailable"),
        RequestTimeoutError: lambda _r, e: error_response(408, str(e), "timeout_error", param="timeout",
                                                          code="request_timeout"),
        ModelNotFoundError: lambda _r, e: error_response(404, str(e), param="model", code="model_not_found"),
        BodyTooLargeError: lambda _r, e: error_response(413, str(e.detail), code="request_too_large"),
        StarletteHTTPException: lambda _r, e: error_response(e.status_code, str(e.detail)),
        ClientDisconnectedError: lambda _r, _e: error_response(499, "client closed the request"),
    }
    for exc_type, handler in handlers.items():
        app.add_exception_handler(exc_type, handler)


# ----- app -----

EventsFn = Callable[[AsyncIterator[GenerationChunk], str, str, bool], AsyncIterator[str]]
BodyFn = Callable[[str, str, list[GenerationChunk]], BaseModel]


class OpenAIServer:
    """Route handlers bound to one backend."""

    def __init__(self, backend: GenerationBackend, tracer: RequestTracer | None = None) -> None:
        self.backend = backend
        self.tracer = tracer

    def check_model(self, model: str | None) -> None:
        if model and model != self.backend.model_name:
            raise ModelNotFoundError(
                f"The model `{model}` does not exist; this server serves `{self.backend.model_name}`"
            )

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        self.check_model(body.model)
        body.check_supported()
        prompt = body.single_prompt()
        ids = (await encode_prompt(self.backend.tokenizer, prompt, self.backend.max_context) if isinstance(prompt, str)
               else list(prompt))
        max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        return await self._serve(request, body, ids, max_tokens, "text_completion", "cmpl", completion_events,
                                 completion_body)

    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Response:
        self.check_model(body.model)
        body.check_supported()
        ids = await chat_ids(self.backend.tokenizer, body.messages, self.backend.max_context)
        max_tokens = body.requested_max_tokens
        if max_tokens is None:  # OpenAI: as much as the context allows
            max_tokens = max(1, self.backend.max_context - len(ids))
        return await self._serve(request, body, ids, max_tokens, "chat", "chatcmpl", chat_events, chat_body)

    async def _serve(
        self,
        request: Request,
        body: CompletionRequest | ChatCompletionRequest,
        ids: list[int],
        max_tokens: int,
        operation: str,  # gen_ai.operation.name
        id_prefix: str,
        events: EventsFn,
        build: BodyFn,
    ) -> Response:
        request_id = f"{id_prefix}-{uuid.uuid4().hex}"
        model = self.backend.model_name
        params = body.sampling_params(max_tokens)
        deadline = None if body.timeout is None else asyncio.get_running_loop().time() + body.timeout
        # A stream past its deadline ends with an "abort" chunk; a request with nothing sent by then is a 408.
        stream = traced_stream(self.backend.generate(ids, params, request_id, deadline if body.stream else None,
                                                     partial=body.stream),
                               self.tracer, operation, lambda: request.headers, request_id, params)
        try:
            async with asyncio.timeout_at(deadline):
                chunks = await open_stream(request, stream)
                if not body.stream:
                    collected = await race_disconnect(request, collect(chunks))
        except TimeoutError:
            raise RequestTimeoutError(f"the request's timeout of {body.timeout:g} s passed before it was done; "
                                      "raise `timeout` or lower max_tokens") from None
        if body.stream:
            return sse_response(events(chunks, request_id, model, body.wants_usage_in_stream))
        return JSONResponse(build(request_id, model, collected).model_dump())


def install_health_route(app: FastAPI, backend: GenerationBackend) -> None:
    """GET /health (readiness): the backend's status (mode, batches, counters, draft link), 200 while
    it serves ("ok", or "degraded" with a reason while speculation is off because of a fault), 503
    while it cannot ("unavailable": the verifier is gone; "draining": shutting down).
    GET /health/live (liveness): 200 whenever the process answers at all."""

    @app.get("/health")
    async def health() -> JSONResponse:
        status: dict[str, object] = {"status": "ok", **backend.status()}
        serving = status["status"] in ("ok", "degraded")
        return JSONResponse(status, status_code=200 if serving else 503)

    @app.get("/health/live")
    async def live() -> dict[str, str]:
        return {"status": "alive"}


def install_metrics_route(app: FastAPI, registry: CollectorRegistry) -> None:
    """GET /metrics: the Prometheus text format (vLLM's names plus minedraft's own)."""

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def build_http_app(backend: GenerationBackend, serve_health: bool = True, tracer: RequestTracer | None = None,
                   metrics: CollectorRegistry | None = None, api_keys: ApiKeys | None = None,
                   max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> FastAPI:
    """The FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, /metrics (with a registry)
    and /health; with `api_keys`, every path but /health and /metrics needs one; bodies over
    `max_request_bytes` are refused with 413 before they are read."""
    app = FastAPI(title="minedraft", version=__version__)
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    if api_keys:
        app.add_middleware(ApiKeyGuard, keys=api_keys, open_paths=OPEN_PATHS)
    app.state.backend = backend
    server = OpenAIServer(backend, tracer)
    if metrics is not None:
        install_metrics_route(app, metrics)
    install_error_handlers(app)
    if serve_health:
        install_health_route(app, backend)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return ModelList(data=[ModelCard(id=backend.model_name, max_model_len=backend.max_context)]).model_dump()

    app.add_api_route("/v1/completions", server.completions, methods=["POST"], response_model=None)
    app.add_api_route("/v1/chat/completions", server.chat_completions, methods=["POST"], response_model=None)
    return app
