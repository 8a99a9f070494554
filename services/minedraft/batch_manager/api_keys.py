"""API keys: where they come from and how a presented one is checked (HTTP and gRPC).

Keys come from flags or env (`--api-key` / MINEDRAFT_API_KEY, comma-separated) and from files
with one key per line (`--api-key-file` / MINEDRAFT_API_KEY_FILE: what a mounted Kubernetes
Secret gives); any of them is accepted. A client presents one as `Authorization: Bearer <key>`
(an HTTP header, or gRPC metadata `authorization`). Every comparison is constant-time
(`hmac.compare_digest`) and all keys are compared, so timing does not tell which part of a
guess was right or which key matched. No keys configured means no check.

Inline keys are fixed for the life of the process. Key files are rotated in place: the kubelet
swaps a mounted Secret's files atomically (a symlink swap), so at most once a second a check
stats each file (device, inode, size, mtime) and re-reads it when that changed. A file that
vanished, cannot be read or holds no key never opens the API: the last good keys stay in force
and one warning is logged until the file is good again. A stat and a read of a few bytes on the
Secret's tmpfs take microseconds, so this runs on the request path without a thread.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import grpc

from minedraft.core.errors import InvalidRequestError

BEARER = "bearer "
MISSING = "missing API key: send the header 'Authorization: Bearer <key>'"
WRONG = "invalid API key"
OPEN_GRPC_PREFIXES = ("/grpc.health.v1.Health/",)  # probes and load balancers need no key
RECHECK_S = 1.0  # how often key files are stat'ed for a rotation

log = logging.getLogger(__name__)


def parse_keys(text: str) -> list[str]:
    """Keys in a file: one per line (or comma-separated, as in MINEDRAFT_API_KEY), `#` starts a comment."""
    return [key.strip() for line in text.splitlines() if not line.lstrip().startswith("#")
            for key in line.split(",") if key.strip()]


class KeyFile:
    """One key file and the keys last read from it; `refresh` re-reads it when it changed on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.keys: tuple[str, ...] = ()
        self._stamp: tuple[int, ...] | None = None
        self._problem: str | None = None  # what was last warned about, until the file is good again

    def _current_stamp(self) -> tuple[int, ...]:
        st = os.stat(self.path)  # follows the Secret volume's symlinks to the file now in place
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def load(self) -> None:
        """The first read: a missing file or one without a key is a configuration error."""
        if not self.path.is_file():
            raise InvalidRequestError(f"API key file {self.path} does not exist")
        self._stamp = self._current_stamp()
        self.keys = tuple(parse_keys(self.path.read_text()))

    def refresh(self) -> bool:
        """Re-read the file if it changed; True when the keys changed. Never drops to no keys."""
        try:
            stamp = self._current_stamp()
            if stamp == self._stamp:
                return False
            keys = tuple(parse_keys(self.path.read_text()))
        except (OSError, UnicodeDecodeError) as err:
            self._keep(f"cannot be read ({type(err).__name__}: {err})")
            return False
        self._stamp = stamp
        if not keys:
            self._keep("holds no key")
            return False
        self._problem = None
        if keys == self.keys:
            return False
        log.info("API key file %s changed: %d key(s) in force now", self.path, len(keys))
        self.keys = keys
        return True

    def _keep(self, why: str) -> None:
        if why != self._problem:  # once per problem, not once per check
            log.warning("API key file %s %s: keeping its last %d key(s) until it holds keys again",
                        self.path, why, len(self.keys))
            self._problem = why


class ApiKeys:
    """The accepted keys (empty: authentication is off): fixed inline ones plus those of key files."""

    def __init__(self, keys: Iterable[str] = (), files: Iterable[KeyFile] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._inline = [k.strip() for k in keys if k.strip()]
        self._files = list(files)
        self._clock = clock
        self._next_check = clock() + RECHECK_S
        self._keys = self._combine()

    def _combine(self) -> list[bytes]:
        found = self._inline + [k for f in self._files for k in f.keys]
        return [k.encode() for k in dict.fromkeys(found)]

    @classmethod
    def load(cls, inline: str = "", files: Iterable[str] = (),
             clock: Callable[[], float] = time.monotonic) -> ApiKeys:
        """Keys from a comma-separated string plus files of one key per line (# starts a comment);
        the files are watched for rotation from then on."""
        key_files = [KeyFile(Path(name)) for name in files if name]
        for f in key_files:
            f.load()
        found = cls(inline.split(",") if inline else [], key_files, clock)
        if (inline or key_files) and not found:
            raise InvalidRequestError("API keys were configured but none is non-empty")
        return found

    def refresh(self) -> None:
        """Pick up rotated key files, at most once per RECHECK_S (called by every check)."""
        if not self._files:
            return
        now = self._clock()
        if now < self._next_check:
            return
        self._next_check = now + RECHECK_S
        if any([f.refresh() for f in self._files]):  # a list: every file is refreshed
            self._keys = self._combine()

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def check(self, authorization: str | None) -> str | None:
        """None when `authorization` (the header's value) carries an accepted key, else why not."""
        self.refresh()
        keys = self._keys
        if not keys:
            return None
        if not authorization or authorization[: len(BEARER)].lower() != BEARER:
            return MISSING
        presented = authorization[len(BEARER):].strip().encode()
        matched = False
        for key in keys:  # no early exit: the time does not depend on which key matched
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
