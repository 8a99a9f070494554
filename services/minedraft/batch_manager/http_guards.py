"""ASGI middleware in front of the HTTP apps: a body size limit and the API key check.

Both answer before FastAPI parses anything. The size limit refuses a declared Content-Length
over the limit without reading a byte of the body, and counts a body sent without one
(chunked) as it arrives, cutting it at the limit; either way the answer is 413 in the OpenAI
error shape. The key check answers 401 on every path but the open ones (health, metrics).
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minedraft.batch_manager.api_keys import ApiKeys

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024


class BodyTooLargeError(HTTPException):
    """The request body passed the limit while it was being read (an HTTPException, so FastAPI's
    body parsing lets it through as a 413 instead of turning it into a generic 400)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, too_large_message(max_bytes))


def too_large_message(max_bytes: int) -> str:
    return (f"request body is over the limit of {max_bytes} bytes (the server's --max-request-bytes); "
            "send a shorter prompt")


async def send_error(send: Send, status: int, message: str, type_: str, code: str,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class BodyLimit:
    """413 for a request body over `max_bytes` (0: no limit)."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _too_large(self, send: Send) -> None:
        await send_error(send, 413, too_large_message(self.max_bytes), "invalid_request_error", "request_too_large",
                         [(b"connection", b"close")])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.max_bytes <= 0:
            await self.app(scope, receive, send)
            return
        declared = header(scope, b"content-length")
        if declared is not None and (not declared.strip().isdigit() or int(declared) > self.max_bytes):
            await self._too_large(send)
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLargeError(self.max_bytes)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLargeError:
            if not started:
                await self._too_large(send)


class ApiKeyGuard:
    """401 unless the request carries an accepted key; `open_paths` need none."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, open_paths: frozenset[str]) -> None:
        self.app = app
        self.keys = keys
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.keys and scope["path"] not in self.open_paths:
            problem = self.keys.check(header(scope, b"authorization"))
            if problem is not None:
                await send_error(send, 401, problem, "invalid_request_error", "invalid_api_key",
                                 [(b"www-authenticate", b"Bearer")])
                return
        await self.app(scope, receive, send)
