"""gRPC API end to end: a real grpc.aio server over EngineBackend (speculative mode) on the random pair."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from minedraft.batch_manager.backend import GenerationBackend
from minedraft.batch_manager.grpc_api import SERVICE_NAME, GrpcServer, build_grpc_server
from minedraft.core.sampling_params import SamplingParams
from minedraft.proto import _codegen
from minedraft.proto import generation_pb2 as pb
from minedraft.proto import generation_pb2_grpc as pb_grpc
from tests.conftest import engine_from_folders, wait_until
from tests.engine_backend import EngineBackend, all_kv_free

T = TypeVar("T")
PROMPTS = ["w5 w9 w13", [7, 7, 7, 7, 7, 7], [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], "w42"]
MAX_TOKENS = 20


class LoopThread:
    """An asyncio loop in a daemon thread, so tests can use the plain synchronous gRPC client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class Server:
    stub: pb_grpc.GenerationStub
    channel: grpc.Channel
    backend: GenerationBackend


def serve(loop: LoopThread, backend: GenerationBackend) -> Iterator[Server]:
    """The gRPC server over `backend` on a free loopback port, with a stub, until the generator is closed."""
    async def start() -> GrpcServer:
        server = build_grpc_server(backend, "127.0.0.1", 0)
        await server.start()
        return server

    server = loop.run(start())
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    yield Server(pb_grpc.GenerationStub(channel), channel, backend)
    channel.close()
    loop.run(server.stop(None))


@pytest.fixture(scope="module")
def served(random_pair: tuple[Path, Path]) -> Iterator[Server]:
    target, draft = random_pair
    engine = engine_from_folders(target, draft, "sd", k=3, block_size=4, num_blocks=256, max_num_seqs=2)
    loop = LoopThread()
    with EngineBackend(engine, model_name="random", max_queue=1) as backend:
        yield from serve(loop, backend)
    loop.stop()


@pytest.fixture(scope="module")
def reference(random_pair: tuple[Path, Path]) -> list[tuple[list[int], str]]:
    """Greedy AR output of each prompt run alone, as (token ids, text)."""
    engine = engine_from_folders(random_pair[0], None, "ar", block_size=4, num_blocks=256)
    out = []
    for prompt in PROMPTS:
        (req,) = engine.generate([prompt], SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
        out.append((req.output_ids, req.text))
    return out


def request(prompt: str | list[int], request_id: str = "", **sampling: Any) -> pb.GenerateRequest:
    params = pb.SamplingParameters(**{"max_tokens": MAX_TOKENS, "temperature": 0.0, **sampling})
    if isinstance(prompt, str):
        return pb.GenerateRequest(request_id=request_id, text=prompt, sampling=params)
    return pb.GenerateRequest(request_id=request_id, token_ids=pb.TokenIds(ids=prompt), sampling=params)


def test_greedy_unary_equals_engine_generate(served: Server, reference: list[tuple[list[int], str]]) -> None:
    for prompt, (ids, text) in zip(PROMPTS, reference, strict=True):
        response = served.stub.Generate(request(prompt, request_id="r1"))
        assert list(response.token_ids) == ids
        assert response.text == text
        assert response.request_id == "r1"
        assert response.finish_reason in ("stop", "length")
        assert response.usage.completion_tokens == len(ids)


def test_stream_concatenates_to_unary(served: Server) -> None:
    for prompt in PROMPTS[:2]:
        unary = served.stub.Generate(request(prompt))
        chunks = list(served.stub.GenerateStream(request(prompt)))
        assert "".join(c.text for c in chunks) == unary.text
        assert [t for c in chunks for t in c.token_ids] == list(unary.token_ids)
        assert [c.finish_reason for c in chunks[:-1]] == [""] * (len(chunks) - 1)
        assert chunks[-1].finish_reason == unary.finish_reason
        assert chunks[-1].usage == unary.usage
        assert len({c.request_id for c in chunks}) == 1


def test_unset_sampling_uses_documented_defaults(served: Server) -> None:
    response = served.stub.Generate(pb.GenerateRequest(text="w5 w9", sampling=pb.SamplingParameters(seed=3)))
    assert response.usage.completion_tokens <= 16
    again = served.stub.Generate(pb.GenerateRequest(text="w5 w9", sampling=pb.SamplingParameters(seed=3)))
    assert again.token_ids == response.token_ids  # seeded sampling at temperature 1 is reproducible


@pytest.mark.parametrize(
    ("req", "field"),
    [
        (request("w5 w9", temperature=-1.0), "temperature"),
        (request("w5 w9", top_p=0.0), "top_p"),
        (request("w5 w9", top_k=-3), "top_k"),
        (request("w5 w9", max_tokens=0), "max_tokens"),
        (request([]), "prompt"),
        (pb.GenerateRequest(), "prompt"),
        (request([5, 500]), "prompt token ids"),
        (request([5] * 40, max_tokens=250), "max_tokens"),
    ],
    ids=["temperature", "top_p", "top_k", "max_tokens", "empty", "no-prompt", "vocab", "context"],
)
def test_bad_requests_are_invalid_argument_and_server_keeps_serving(
    served: Server, req: pb.GenerateRequest, field: str
) -> None:
    for call in (served.stub.Generate, lambda r: list(served.stub.GenerateStream(r))):
        with pytest.raises(grpc.RpcError) as info:
            call(req)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in info.value.details()
    assert served.stub.Generate(request("w5 w9", max_tokens=2)).usage.completion_tokens == 2


def test_full_queue_is_resource_exhausted(served: Server) -> None:
    """max_num_seqs=2 + max_queue=1: with the engine paused, the fourth request is refused."""
    backend = served.backend
    backend.pause()
    try:
        futures = [served.stub.Generate.future(request("w5 w9", max_tokens=3)) for _ in range(3)]
        wait_until(lambda: backend.status()["waiting"] == 3)
        with pytest.raises(grpc.RpcError) as info:
            served.stub.Generate(request("w5 w9", max_tokens=3))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        backend.resume()
    assert [f.result(timeout=30).usage.completion_tokens for f in futures] == [3, 3, 3]


def test_cancelled_stream_aborts_and_frees_every_kv_block(served: Server) -> None:
    backend = served.backend
    aborted = backend.status()["aborted"]
    call = served.stub.GenerateStream(request("w5 w9 w13", max_tokens=250, ignore_eos=True))
    first = next(call)
    assert first.text
    backend.pause()  # the request cannot finish on its own now; only the abort can free its blocks
    try:
        wait_until(lambda: not all_kv_free(backend.status()))
        call.cancel()
        wait_until(lambda: backend.status()["aborted"] == aborted + 1 and all_kv_free(backend.status()))
        assert backend.status()["running"] == 0 and backend.status()["waiting"] == 0
    finally:
        backend.resume()
    assert served.stub.Generate(request("w5", max_tokens=2)).usage.completion_tokens == 2


def test_health_reports_serving(served: Server) -> None:
    health = health_pb2_grpc.HealthStub(served.channel)
    for service in ("", SERVICE_NAME):
        response = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_generation_service(served: Server) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(served.channel)
    (response,) = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for s in response.list_services_response.service}
    assert {"minedraft.v1.Generation", "grpc.health.v1.Health"} <= names


def test_stub_generator_detects_stale_protos(tmp_path: Path) -> None:
    """The build hook regenerates exactly when a .proto changes, and fixes the imports."""
    source = tmp_path / "v1"
    source.mkdir()
    for proto in _codegen.proto_files(Path(__file__).resolve().parents[1] / "proto" / "minedraft" / "v1"):
        shutil.copy(proto, source)
    out = tmp_path / "out"
    assert not _codegen.is_fresh(source, out)
    written = _codegen.generate(source, out)
    assert {p.name for p in written} >= {"generation_pb2.py", "generation_pb2_grpc.py", "generation_pb2.pyi"}
    assert _codegen.is_fresh(source, out)
    assert "from minedraft.proto import generation_pb2" in (out / "generation_pb2_grpc.py").read_text()
    with (source / "generation.proto").open("a") as fh:
        fh.write("\nmessage Extra {}\n")
    assert not _codegen.is_fresh(source, out)


def test_installed_stubs_match_the_protos() -> None:
    """A checkout whose stubs lag its .proto files fails here (fix: re-run bin/_venv.sh or pip install -e .)."""
    package = Path(_codegen.__file__).resolve().parent
    source = Path(__file__).resolve().parents[1] / "proto" / "minedraft" / "v1"
    assert _codegen.is_fresh(source, package)
