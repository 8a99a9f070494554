"""The real batch manager process against a broken verifier (a real gRPC worker endpoint whose verdicts do not
add up): handling the event raises, the request ends with UNAVAILABLE naming the error, and the process exits
with status 1 so that `minedraft serve` or Kubernetes restarts it, instead of hanging with the request open."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from minedraft.bundled import TINY_TARGET
from minedraft.cli.local_stack import free_port
from minedraft.core.tokenizer import Tokenizer
from minedraft.proto import control_pb2, control_pb2_grpc, generation_pb2, generation_pb2_grpc


class BrokenVerifier(control_pb2_grpc.WorkerServicer):
    """Answers Info truthfully enough to be accepted, then every plan with verdicts whose lists disagree."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def Info(self, request: control_pb2.InfoRequest, context: grpc.ServicerContext) -> control_pb2.WorkerInfo:
        return control_pb2.WorkerInfo(role="verifier", vocab_size=self.vocab_size, max_context=256, num_blocks=64,
                                      free_blocks=64, device="cpu", block_size=16)

    def Control(self, requests: Iterator[control_pb2.ControlMessage],
                context: grpc.ServicerContext) -> Iterator[control_pb2.WorkerEvent]:
        for message in requests:
            if message.WhichOneof("body") == "plan" and message.plan.verify_batch:
                plan = message.plan
                yield control_pb2.WorkerEvent(step=plan.step, verdicts=control_pb2.Verdicts(
                    seq_ids=list(plan.verify_batch), counts=[1, 1], accepted=[0], tokens=[5]))  # counts: one too many


@pytest.fixture
def broken_verifier() -> Iterator[int]:
    port = free_port()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    control_pb2_grpc.add_WorkerServicer_to_server(BrokenVerifier(Tokenizer(TINY_TARGET).vocab_size), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield port
    server.stop(grace=None)


def test_the_manager_fails_the_request_and_exits_with_status_1(broken_verifier: int) -> None:
    grpc_port, http_port = free_port(), free_port()
    manager = subprocess.Popen(
        [sys.executable, "-m", "minedraft.cli.main", "batch-manager", "--tokenizer", str(TINY_TARGET),
         "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--admin-port", "0",
         "--mode", "ar", "--verifier-address", f"127.0.0.1:{broken_verifier}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
            stub = generation_pb2_grpc.GenerationStub(channel)
            with pytest.raises(grpc.RpcError) as failure:
                stub.Generate(generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=[5, 6, 7]),
                                                             sampling=generation_pb2.SamplingParameters(max_tokens=8)),
                             timeout=30)
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "event handling failed (ValueError" in (failure.value.details() or "")
        assert manager.wait(timeout=30) == 1
        assert "exiting with status 1 so the process is restarted" in (manager.stdout.read() if manager.stdout else "")
    finally:
        if manager.poll() is None:
            manager.kill()
            manager.wait()

