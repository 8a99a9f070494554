"""API keys: where they come from and how a presented one is checked (HTTP and gRPC).

Keys come from flags or env (`--api-key` / MINEDRAFT_API_KEY, comma-separated) and from files
with one key per line (`--api-key-file` / MINEDRAFT_API_KEY_FILE: what a mounted Kubernetes
Secret gives); any of them is accepted. A client presents one as `Authorization: Bearer <key>`
(an HTTP header, or gRPC metadata `authorization`). Every comparison is constant-time
(`hmac.compare_digest`) and all keys are compared, so timing does not tell which part of a
guess was right or which key matched. No keys configured means no check.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import grpc

from minedraft.core.errors import InvalidRequestError

BEARER = "bearer "
MISSING = "missing API key: send the header 'Authorization: Bearer <key>'"
WRONG = "invalid API key"
OPEN_GRPC_PREFIXES = ("/grpc.health.v1.Health/",)  # probes and load balancers need no key


class ApiKeys:
    """The accepted keys (empty: authentication is off)."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._keys = [k.encode() for k in dict.fromkeys(k.strip() for k in keys) if k]

    @classmethod
    def load(cls, inline: str = "", files: Iterable[str] = ()) -> ApiKeys:
        """Keys from a comma-separated string plus files of one key per line (# starts a comment)."""
        keys = inline.split(",") if inline else []
        for name in files:
            if not name:
                continue
            path = Path(name)
            if not path.is_file():
                raise InvalidRequestError(f"API key file {name} does not exist")
            keys += [line.strip() for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
        found = cls(keys)
        if (inline or any(files)) and not found:
            raise InvalidRequestError("API keys were configured but none is non-empty")
        return found

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def check(self, authorization: str | None) -> str | None:
        """None when `authorization` (the header's value) carries an accepted key, else why not."""
        if not self._keys:
            return None
        if not authorization or authorization[: len(BEARER)].lower() != BEARER:
            return MISSING
        presented = authorization[len(BEARER):].strip().encode()
        matched = False
        for key in self._keys:  # no early exit: the time does not depend on which key matched
            matched |= hmac.compare_digest(presented, key)
        return None if matched else WRONG


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape that ends the call with UNAUTHENTICATED."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds = (("unary_unary", grpc.unary_unary_rpc_method_handler),
             ("unary_stream", grpc.unary_stream_rpc_method_handler),
             ("stream_unary", grpc.stream_unary_rpc_method_handler),
             ("stream_stream", grpc.stream_stream_rpc_method_handler))
    for attribute, make in kinds:
        if getattr(handler, attribute) is not None:
            return make(refuse, request_deserializer=handler.request_deserializer,
                        response_serializer=handler.response_serializer)
    raise AssertionError("a gRPC method handler of no known kind")


class GrpcApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Every method but grpc.health.v1 needs `authorization: Bearer <key>` metadata."""

    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_GRPC_PREFIXES):
            return handler
        metadata = dict(details.invocation_metadata or ())
        problem = self.keys.check(metadata.get("authorization"))  # type: ignore[arg-type]
        return handler if problem is None else _refusal(handler, problem)
