"""gRPC API (minedraft.v1.Generation) over any GenerationBackend, with health and reflection.

Handlers await every step themselves (streaming uses `context.write`, not an async
generator), so a client cancellation (or the client's deadline passing) arrives as
CancelledError in our own frame and the `aclosing` block aborts the request on the spot
instead of whenever the GC gets to it. With API keys every method but grpc.health.v1 needs
`authorization: Bearer <key>` metadata; messages are capped at the request size limit.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from minedraft.batch_manager.api_keys import ApiKeys, GrpcApiKeyInterceptor
from minedraft.batch_manager.backend import (
    GenerationBackend,
    GenerationChunk,
    QueueFullError,
    RetryLaterError,
    UnavailableError,
)
from minedraft.batch_manager.http_guards import DEFAULT_MAX_REQUEST_BYTES
from minedraft.batch_manager.prompt_ids import encode_prompt
from minedraft.batch_manager.request_tracing import traced_stream
from minedraft.core.codec import sampling_from_api
from minedraft.core.errors import InvalidRequestError
from minedraft.observability.tracing import RequestTracer
from minedraft.proto import generation_pb2, generation_pb2_grpc

SERVICE_NAME = generation_pb2.DESCRIPTOR.services_by_name["Generation"].full_name  # "minedraft.v1.Generation"


def _usage(chunk: GenerationChunk) -> generation_pb2.Usage:
    return generation_pb2.Usage(prompt_tokens=chunk.prompt_tokens, completion_tokens=chunk.completion_tokens)


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    """Maps backend errors to status codes: bad input -> INVALID_ARGUMENT, full -> RESOURCE_EXHAUSTED."""

    def __init__(self, backend: GenerationBackend, tracer: RequestTracer | None = None) -> None:
        self.backend = backend
        self.tracer = tracer

    async def _prompt_ids(self, request: generation_pb2.GenerateRequest) -> list[int]:
        kind = request.WhichOneof("prompt")
        if kind == "text":
            return await encode_prompt(self.backend.tokenizer, request.text, self.backend.max_context)
        if kind == "token_ids":
            return list(request.token_ids.ids)
        return []  # rejected by validation as an empty prompt

    async def _chunks(
        self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext, partial: bool = True
    ) -> AsyncIterator[tuple[str, GenerationChunk]]:
        """Backend chunks of one request; errors before the first chunk become gRPC statuses."""
        request_id = request.request_id or f"req-{uuid.uuid4().hex}"
        params = sampling_from_api(request.sampling)
        try:
            prompt_ids = await self._prompt_ids(request)

            def carrier() -> dict[str, str]:
                return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}

            stream = traced_stream(self.backend.generate(prompt_ids, params, request_id, partial=partial), self.tracer,
                                   "text_completion", carrier, request_id, params)
            async with aclosing(stream):
                async for chunk in stream:
                    yield request_id, chunk
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except (QueueFullError, UnavailableError) as exc:
            await _retry_later(context, exc)
        except RuntimeError as exc:  # engine failure or backend shut down
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))

    async def Generate(
        self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> generation_pb2.GenerateResponse:
        response = generation_pb2.GenerateResponse()
        parts: list[str] = []
        async with aclosing(self._chunks(request, context, partial=False)) as chunks:
            async for request_id, chunk in chunks:
                response.request_id = request_id
                parts.append(chunk.text)
                response.token_ids.extend(chunk.token_ids)
                response.finish_reason = chunk.finish_reason or ""
                response.usage.CopyFrom(_usage(chunk))
        response.text = "".join(parts)
        return response

    async def GenerateStream(self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        async with aclosing(self._chunks(request, context)) as chunks:
            async for request_id, chunk in chunks:
                await context.write(
                    generation_pb2.GenerateChunk(
                        request_id=request_id,
                        text=chunk.text,
                        token_ids=chunk.token_ids,
                        finish_reason=chunk.finish_reason or "",
                        usage=_usage(chunk),
                    )
                )


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
