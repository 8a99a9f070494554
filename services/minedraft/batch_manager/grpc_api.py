"""gRPC API (minedraft.v1.Generation) over any GenerationBackend, with health and reflection.

Handlers await every step themselves (streaming uses `context.write`, not an async
generator), so a client cancellation arrives as CancelledError in our own frame and the
`aclosing` block aborts the request on the spot instead of whenever the GC gets to it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from minedraft.batch_manager.backend import GenerationBackend, GenerationChunk, QueueFullError, UnavailableError
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

    def _prompt_ids(self, request: generation_pb2.GenerateRequest) -> list[int]:
        kind = request.WhichOneof("prompt")
        if kind == "text":
            return self.backend.tokenizer.encode(request.text)
        if kind == "token_ids":
            return list(request.token_ids.ids)
        return []  # rejected by validation as an empty prompt

    async def _chunks(
        self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tuple[str, GenerationChunk]]:
        """Backend chunks of one request; errors before the first chunk become gRPC statuses."""
        request_id = request.request_id or f"req-{uuid.uuid4().hex}"
        params = sampling_from_api(request.sampling)
        try:
            carrier = {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}
            stream = traced_stream(self.backend.generate(self._prompt_ids(request), params, request_id), self.tracer,
                                   "text_completion", carrier, request_id, params)
            async with aclosing(stream):
                async for chunk in stream:
                    yield request_id, chunk
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except QueueFullError as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except UnavailableError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except RuntimeError as exc:  # engine failure or backend shut down
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))

    async def Generate(
        self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> generation_pb2.GenerateResponse:
        response = generation_pb2.GenerateResponse()
        parts: list[str] = []
        async with aclosing(self._chunks(request, context)) as chunks:
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

    async def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING first so load balancers stop routing, then drain for `grace` seconds."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


def build_grpc_server(backend: GenerationBackend, host: str = "0.0.0.0", port: int = 50051,
                      tracer: RequestTracer | None = None) -> GrpcServer:
    """Generation + grpc.health.v1 + reflection, bound but not started; port=0 lets the OS choose."""
    server = grpc.aio.server()
    generation_pb2_grpc.add_GenerationServicer_to_server(GenerationServicer(backend, tracer), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind gRPC server to {host}:{port}")
    return GrpcServer(server, bound, health_servicer)
