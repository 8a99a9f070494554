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
from dataclasses import dataclass
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
from minedraft.batch_manager.chat_request import ChatTools, plan_chat
from minedraft.batch_manager.choice_output import OutputOptions, PromptInfo
from minedraft.batch_manager.fan_out import FanOut, Generation, best_candidates, plan_generations
from minedraft.batch_manager.http_guards import DEFAULT_MAX_REQUEST_BYTES, ApiKeyGuard, BodyLimit, BodyTooLargeError
from minedraft.batch_manager.http_streams import (
    ClientDisconnectedError,
    StreamSettings,
    chat_body,
    chat_events,
    completion_body,
    completion_events,
    race_disconnect,
    sse_response,
)
from minedraft.batch_manager.openai_logprobs import TokenNames
from minedraft.batch_manager.openai_models import ChatCompletionRequest, CompletionRequest
from minedraft.batch_manager.openai_responses import ErrorDetail, ErrorResponse, ModelCard, ModelList
from minedraft.batch_manager.prompt_ids import completion_prompts, keep_last, render_options
from minedraft.batch_manager.request_tracing import traced_stream
from minedraft.batch_manager.tokenize_api import install_tokenize_routes
from minedraft.core.errors import InvalidRequestError
from minedraft.core.sampling_params import SamplingParams
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

EventsFn = Callable[[AsyncIterator[tuple[int, GenerationChunk]], OutputOptions, StreamSettings], AsyncIterator[str]]
BodyFn = Callable[[StreamSettings, OutputOptions, list[list[GenerationChunk]]], BaseModel]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What differs between /v1/completions and /v1/chat/completions."""

    operation: str  # gen_ai.operation.name
    id_prefix: str
    events: EventsFn
    build: BodyFn


COMPLETIONS = Endpoint("text_completion", "cmpl", completion_events, completion_body)
CHAT = Endpoint("chat", "chatcmpl", chat_events, chat_body)


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
        prompts = await completion_prompts(self.backend, body)
        options = OutputOptions(TokenNames(self.backend.tokenizer, bool(body.return_tokens_as_token_ids)), prompts,
                                body.choices_per_prompt, body.logprobs, body.prompt_logprobs, bool(body.echo),
                                body.echo_only)
        return await self._serve(request, body, COMPLETIONS, body.sampling_params(body.resolved_max_tokens()), options,
                                 body.candidates)

    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Response:
        self.check_model(body.model)
        body.check_supported()
        tools = ChatTools(body.tools, body.tool_choice, body.parallel_tool_calls)
        plan = await plan_chat(self.backend.tokenizer, body.messages, render_options(body), self.backend.max_context,
                               tools, body.structured_output())
        ids = keep_last(plan.ids, body.keep_prompt_tokens(self.backend.max_context))
        max_tokens = body.requested_max_tokens
        if max_tokens is None:  # OpenAI: as much as the context allows
            max_tokens = max(1, self.backend.max_context - len(ids))
        top_n = (body.top_logprobs or 0) if body.logprobs else None
        options = OutputOptions(TokenNames(self.backend.tokenizer, bool(body.return_tokens_as_token_ids)),
                                [PromptInfo(ids, body.echo_text)], body.choices_per_prompt, top_n,
                                body.prompt_logprobs, assistant=plan.assistant)
        params = body.sampling_params(max_tokens)
        params.structured = plan.structured  # the reply's whole grammar: reasoning, answer, tool calls
        return await self._serve(request, body, CHAT, params, options, body.choices_per_prompt)

    async def _serve(self, request: Request, body: CompletionRequest | ChatCompletionRequest, endpoint: Endpoint,
                     params: SamplingParams, options: OutputOptions, candidates: int) -> Response:
        """Run the request's generations (prompts x candidates) and answer with a stream or one body."""
        request_id = f"{endpoint.id_prefix}-{body.request_id or uuid.uuid4().hex}"
        settings = StreamSettings(request_id, self.backend.model_name, body.wants_usage_in_stream,
                                  body.wants_continuous_usage)
        generations = plan_generations(request_id, [p.ids for p in options.prompts], params, candidates,
                                       rank_by_logprob=candidates > options.per_prompt)
        deadline = None if body.timeout is None else asyncio.get_running_loop().time() + body.timeout

        def traced(g: Generation, stream: AsyncIterator[GenerationChunk]) -> AsyncIterator[GenerationChunk]:
            return traced_stream(stream, self.tracer, endpoint.operation, lambda: request.headers, g.request_id,
                                 g.params)

        # A stream past its deadline ends with an "abort" chunk; a request with nothing sent by then is a 408.
        fan: FanOut | None = None
        try:
            async with asyncio.timeout_at(deadline):
                fan = await FanOut.open(request, self.backend, generations, deadline if body.stream else None,
                                        bool(body.stream), traced)
                if not body.stream:
                    collected = await race_disconnect(request, fan.collect())
        except TimeoutError:
            raise RequestTimeoutError(f"the request's timeout of {body.timeout:g} s passed before it was done; "
                                      "raise `timeout` or lower max_tokens") from None
        finally:
            if fan is not None and not body.stream:
                await fan.aclose()
        if body.stream:
            assert fan is not None
            return sse_response(endpoint.events(fan.merged(), options, settings), on_close=fan.aclose)
        choices = best_candidates(collected, candidates, options.per_prompt)
        return JSONResponse(endpoint.build(settings, options, choices).model_dump())


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
    """The FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize,
    /tokenizer_info, /metrics (with a registry) and /health; with `api_keys`, every path but /health and
    /metrics needs one; bodies over
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
    install_tokenize_routes(app, backend, server.check_model)
    return app
