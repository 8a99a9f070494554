"""A uvicorn server over EngineBackend on the random pair, for the HTTP surface and client tests."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from minedraft.batch_manager.http_api import build_http_app
from tests.conftest import engine_from_folders, wait_until
from tests.engine_backend import EngineBackend

MODEL = "random"


@dataclass
class Served:
    backend: EngineBackend
    url: str
    client: httpx.Client

    def complete(self, **payload: Any) -> dict[str, Any]:
        reply = self.client.post("/v1/completions", json={"model": MODEL, **payload})
        assert reply.status_code == 200, reply.text
        return reply.json()

    def chat(self, **payload: Any) -> dict[str, Any]:
        reply = self.client.post("/v1/chat/completions", json={"model": MODEL, **payload})
        assert reply.status_code == 200, reply.text
        return reply.json()

    def stream(self, path: str, **payload: Any) -> list[dict[str, Any]]:
        with self.client.stream("POST", path, json={"model": MODEL, "stream": True, **payload}) as reply:
            assert reply.status_code == 200, reply.read()
            return sse_events(reply)


def sse_events(response: httpx.Response) -> list[dict[str, Any]]:
    """Parsed `data:` events of a stream, checking it ends with [DONE]."""
    lines = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@contextmanager
def serve(target: Path, max_num_seqs: int = 8, num_blocks: int = 512, max_queue: int = 64,
          timeout_s: float = 60) -> Iterator[Served]:
    """The HTTP app over an in-process AR engine on `target`, on a free loopback port, with a client."""
    engine = engine_from_folders(target, None, "ar", block_size=4, num_blocks=num_blocks, max_num_seqs=max_num_seqs)
    with EngineBackend(engine, model_name=MODEL, max_queue=max_queue) as backend, http_app(backend) as url, \
            httpx.Client(base_url=url, timeout=timeout_s) as client:
        yield Served(backend, url, client)


@contextmanager
def http_app(backend: Any) -> Iterator[str]:
    """The HTTP app over `backend` on a free loopback port (its base URL) until the block ends."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(build_http_app(backend), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        thread.join(10)
