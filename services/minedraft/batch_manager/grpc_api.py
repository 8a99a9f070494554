"""gRPC API (minedraft.v1.Generation) over any GenerationBackend, with health and reflection.

Handlers await every step themselves (streaming uses `context.write`, not an async
generator), so a client cancellation (or the client's deadline passing) arrives as
CancelledError in our own frame and the `aclosing` block aborts the request on the spot
instead of whenever the GC gets to it. A request for n choices (or best_of candidates) runs as that
many backend requests sharing the prompt (choices.py); every one of them is closed when the call
ends, however it ends. A chat prompt is rendered, constrained and read back as /v1/chat/completions does it
(grpc_chat.py). With API keys every method but grpc.health.v1 needs `authorization: Bearer <key>` metadata;
messages are capped at the request size limit.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from minedraft.batch_manager.api_keys import ApiKeys, GrpcApiKeyInterceptor
from minedraft.batch_manager.assistant_output import AssistantPlan, AssistantState
from minedraft.batch_manager.backend import (
    GenerationBackend,
    GenerationChunk,
    QueueFullError,
    RetryLaterError,
    UnavailableError,
)
from minedraft.batch_manager.choices import FanOut, close_all, collect, interleave
from minedraft.batch_manager.grpc_chat import plan_grpc_chat, structured_of
from minedraft.batch_manager.grpc_messages import TokenText, chunk_message, response_message
from minedraft.batch_manager.http_guards import DEFAULT_MAX_REQUEST_BYTES
from minedraft.batch_manager.prompt_ids import encode_prompt
from minedraft.batch_manager.request_tracing import traced_stream
from minedraft.core.codec import sampling_from_api
from minedraft.core.errors import InvalidRequestError
from minedraft.core.sampling_params import SamplingParams
from minedraft.observability.tracing import RequestTracer
from minedraft.proto import generation_pb2, generation_pb2_grpc

SERVICE_NAME = generation_pb2.DESCRIPTOR.services_by_name["Generation"].full_name  # "minedraft.v1.Generation"


@dataclass(slots=True)
class _Run:
    """The backend streams of one call (one per choice or best_of candidate) and what the reply needs."""

    request_id: str
    fan: FanOut
    params: SamplingParams  # as the user gave them (the children's may have logprobs forced on)
    streams: list[AsyncIterator[GenerationChunk]] = field(default_factory=list)  # traced
    raw: list[AsyncIterator[GenerationChunk]] = field(default_factory=list)  # the backend's own, closed at the end
    assistant: AssistantPlan | None = None  # a chat prompt's reply: reasoning and tool calls to read out


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    """Maps backend errors to status codes: bad input -> INVALID_ARGUMENT, full -> RESOURCE_EXHAUSTED."""

    def __init__(self, backend: GenerationBackend, tracer: RequestTracer | None = None) -> None:
        self.backend = backend
        self.tracer = tracer
        self._text = TokenText(backend.tokenizer)

    async def _prompt_ids(self, request: generation_pb2.GenerateRequest, run: _Run) -> list[int]:
        kind = request.WhichOneof("prompt")
        keep = request.sampling.truncate_prompt_tokens
        if kind == "chat":
            plan = await plan_grpc_chat(self.backend.tokenizer, request.chat, self.backend.max_context,
                                        run.params.structured)
            run.assistant, run.params.structured, ids = plan.assistant, plan.structured, plan.ids
        elif kind == "text":
            # When truncating, a text longer than the context is no error: its last tokens are kept.
            ids = await encode_prompt(self.backend.tokenizer, request.text, sys.maxsize if keep else
                                      self.backend.max_context)
        elif kind == "token_ids":
            ids = list(request.token_ids.ids)
        else:
            return []  # rejected by validation as an empty prompt
        return ids[-keep:] if keep else ids

    async def _start(self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext,
                     streaming: bool) -> _Run:
        """Admit every child; if one is refused, the ones already admitted are closed (aborted)."""
        request_id = request.request_id or f"req-{uuid.uuid4().hex}"
        params = sampling_from_api(request.sampling)
        params.structured = structured_of(request.sampling)
        run = _Run(request_id, FanOut.of(request.n, request.best_of, streaming), params)
        prompt_ids = await self._prompt_ids(request, run)
        share = request_id if run.fan.best_of > 1 else None

        def carrier() -> dict[str, str]:
            return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}

        try:
            for i, child in enumerate(run.fan.child_params(params)):
                child_id = f"{request_id}-{i}" if share else request_id
                raw = self.backend.generate(prompt_ids, child, child_id, partial=streaming, share_prompt=share)
                run.raw.append(raw)
                run.streams.append(traced_stream(raw, self.tracer, "text_completion", carrier, child_id, child))
        except BaseException:
            await close_all(run.raw)
            raise
        return run

    async def Generate(
        self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> generation_pb2.GenerateResponse:
        async with _statuses(context):
            run = await self._start(request, context, streaming=False)
            try:
                candidates = await collect(run.streams)
            finally:
                await close_all(run.raw)
        return response_message(run.request_id, run.fan, candidates, run.params.wants_logprobs, self._text,
                                run.assistant)

    async def GenerateStream(self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        async with _statuses(context):
            run = await self._start(request, context, streaming=True)
            states: dict[int, AssistantState] = {}
            try:
                async with aclosing(interleave(run.streams)) as chunks:
                    async for index, chunk in chunks:
                        state = None if run.assistant is None else states.setdefault(index,
                                                                                     AssistantState(run.assistant))
                        await context.write(chunk_message(run.request_id, index, chunk, self._text, state))
            finally:
                await close_all(run.raw)


@asynccontextmanager
async def _statuses(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    """Backend errors as gRPC statuses (a cancelled call is no error: it propagates and closes the streams)."""
    try:
        yield
    except InvalidRequestError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except (QueueFullError, UnavailableError) as exc:
        await _retry_later(context, exc)
    except RuntimeError as exc:  # engine failure or backend shut down
        await context.abort(grpc.StatusCode.INTERNAL, str(exc))


class RequestDecoding(grpc.aio.ServerInterceptor):
    """Generation's requests are parsed in the handler, so bytes that are not a valid message (a
    string field with invalid UTF-8, a truncated field) are INVALID_ARGUMENT, not UNKNOWN."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(f"/{SERVICE_NAME}/"):
            return handler
        parse = handler.request_deserializer
        inner, make = ((handler.unary_unary, grpc.unary_unary_rpc_method_handler) if handler.unary_unary else
                       (handler.unary_stream, grpc.unary_stream_rpc_method_handler))

        async def parsed(raw: bytes, context: grpc.aio.ServicerContext) -> object:
            try:
                request = parse(raw)
            except DecodeError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid message: {exc}")
            return await inner(request, context)

        return make(parsed, response_serializer=handler.response_serializer)


@dataclass(slots=True)
class GrpcServer:
    """A grpc.aio server plus the health servicer whose status follows its life cycle."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer

    async def start(self) -> None:
        await self.server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def not_serving(self) -> None:
        """Report NOT_SERVING (load balancers stop routing) while calls in flight go on."""
        await self.health.enter_graceful_shutdown()

    async def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING first so load balancers stop routing, then drain for `grace` seconds."""
        await self.not_serving()
        await self.server.stop(grace)


async def _retry_later(context: grpc.aio.ServicerContext, exc: RetryLaterError) -> None:
    """RESOURCE_EXHAUSTED (queue full) or UNAVAILABLE, with a `retry-after` (seconds) trailer."""
    code = grpc.StatusCode.RESOURCE_EXHAUSTED if isinstance(exc, QueueFullError) else grpc.StatusCode.UNAVAILABLE
    context.set_trailing_metadata((("retry-after", str(exc.retry_after_s)),))
    await context.abort(code, str(exc))


def build_grpc_server(backend: GenerationBackend, host: str = "0.0.0.0", port: int = 50051,
                      tracer: RequestTracer | None = None, api_keys: ApiKeys | None = None,
                      max_message_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                      credentials: grpc.ServerCredentials | None = None) -> GrpcServer:
    """Generation + grpc.health.v1 + reflection, bound but not started; port=0 lets the OS choose.
    With `credentials` the port speaks TLS; with `api_keys` every method but health needs a key."""
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max(max_message_bytes, DEFAULT_MAX_REQUEST_BYTES))]
    interceptors: list[grpc.aio.ServerInterceptor] = [RequestDecoding()]
    if api_keys:
        interceptors.insert(0, GrpcApiKeyInterceptor(api_keys))
    server = grpc.aio.server(interceptors=interceptors, options=options)
    generation_pb2_grpc.add_GenerationServicer_to_server(GenerationServicer(backend, tracer), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot bind gRPC server to {host}:{port}")
    return GrpcServer(server, bound, health_servicer)
