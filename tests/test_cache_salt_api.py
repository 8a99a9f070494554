"""vLLM's `cache_salt` on both public APIs: it reaches the backend's SamplingParams on every choice, and an
empty one is refused naming the field (HTTP 400, gRPC INVALID_ARGUMENT), over the real HTTP app (uvicorn) and
the real gRPC server, each over EngineBackend, and from the openai SDK through extra_body."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest

from minedraft.core.sampling_params import SamplingParams
from minedraft.proto import generation_pb2 as pb
from tests.conftest import engine_from_folders
from tests.engine_backend import EngineBackend
from tests.http_surface_support import MODEL, Served, serve
from tests.test_grpc_api import LoopThread, Server, request
from tests.test_grpc_api import serve as serve_grpc

PROMPT = [2, 3, 4, 5, 6, 7]
Seen = list[SamplingParams]


def record(monkeypatch: pytest.MonkeyPatch, backend: EngineBackend) -> Seen:
    """The params of every generation the API layer starts on `backend` (one per choice)."""
    seen: Seen = []
    generate: Callable[..., Any] = backend.generate

    def recording(prompt_ids: list[int], params: SamplingParams, *args: Any, **kwargs: Any) -> Any:
        seen.append(params)
        return generate(prompt_ids, params, *args, **kwargs)

    monkeypatch.setattr(backend, "generate", recording)
    return seen


@pytest.fixture(scope="module")
def http(random_pair: tuple[Path, Path]) -> Iterator[Served]:
    with serve(random_pair[0]) as served:
        yield served


@pytest.fixture(scope="module")
def grpc_served(random_pair: tuple[Path, Path]) -> Iterator[Server]:
    engine = engine_from_folders(random_pair[0], None, "ar", block_size=4, num_blocks=256, max_num_seqs=4)
    loop = LoopThread()
    with EngineBackend(engine, model_name="random", max_queue=8) as backend:
        yield from serve_grpc(loop, backend)
    loop.stop()


BODIES = {"/v1/completions": {"prompt": PROMPT},
          "/v1/chat/completions": {"messages": [{"role": "user", "content": "w5 w9"}]}}


@pytest.mark.parametrize("path", BODIES)
def test_http_salt_reaches_every_choice(http: Served, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    seen = record(monkeypatch, http.backend)
    body = {"model": MODEL, "max_tokens": 3, "temperature": 0, "n": 2, **BODIES[path]}
    assert http.client.post(path, json={**body, "cache_salt": "tenant-a"}).status_code == 200
    assert http.client.post(path, json=body).status_code == 200
    assert [p.cache_salt for p in seen] == ["tenant-a", "tenant-a", None, None]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", BODIES)
def test_http_empty_salt_is_a_400_naming_it(http: Served, path: str, stream: bool) -> None:
    reply = http.client.post(path, json={"model": MODEL, "max_tokens": 3, "stream": stream, "cache_salt": "",
                                         **BODIES[path]})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "cache_salt" and "cache_salt must be a non-empty string" in error["message"]


def test_http_salt_that_is_no_string_is_a_400_naming_it(http: Served) -> None:
    reply = http.client.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "cache_salt": 7})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "cache_salt"


def test_openai_sdk_sends_the_salt_in_extra_body(http: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = record(monkeypatch, http.backend)
    client = openai.OpenAI(base_url=f"{http.url}/v1", api_key="x", max_retries=0)
    client.completions.create(model=MODEL, prompt="w5 w9", max_tokens=2, extra_body={"cache_salt": "a"})
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w5"}], max_tokens=2,
                                   extra_body={"cache_salt": "b"})
    assert [p.cache_salt for p in seen] == ["a", "b"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="w5", max_tokens=2, extra_body={"cache_salt": ""})
    assert refused.value.status_code == 400 and "cache_salt" in str(refused.value)


def test_grpc_salt_reaches_the_backend(grpc_served: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = record(monkeypatch, grpc_served.backend)  # type: ignore[arg-type]
    grpc_served.stub.Generate(request(PROMPT, cache_salt="tenant-a", max_tokens=3))
    list(grpc_served.stub.GenerateStream(pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=PROMPT), n=2, sampling=pb.SamplingParameters(max_tokens=2, cache_salt="b"))))
    grpc_served.stub.Generate(request(PROMPT, max_tokens=3))
    assert [p.cache_salt for p in seen] == ["tenant-a", "b", "b", None]


@pytest.mark.parametrize("streaming", [False, True])
def test_grpc_empty_salt_is_invalid_argument_naming_it(grpc_served: Server, streaming: bool) -> None:
    call = grpc_served.stub.GenerateStream if streaming else grpc_served.stub.Generate
    with pytest.raises(grpc.RpcError) as refused:
        reply = call(request(PROMPT, cache_salt="", max_tokens=3))
        if streaming:
            list(reply)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cache_salt must be a non-empty string" in (refused.value.details() or "")
