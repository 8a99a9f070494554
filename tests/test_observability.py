"""Metrics and traces of a running stack (three processes), read back the way real tools read them:
/metrics through Prometheus' text parser, spans through an OTLP receiver the exporters send to."""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
from prometheus_client.parser import text_string_to_metric_families

from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.proto import generation_pb2, generation_pb2_grpc
from tests.conftest import wait_until

MAX_TOKENS = 12


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """What an OpenTelemetry collector receives: (service name, span) pairs."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, trace_pb2.Span]] = []
        self.lock = threading.Lock()

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
               ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self.lock:
            for resource_spans in request.resource_spans:
                attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    self.spans.extend((attrs.get("service.name", ""), span) for span in scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def of_trace(self, trace_id: str) -> list[trace_pb2.Span]:
        with self.lock:
            return [span for _, span in self.spans if span.trace_id.hex() == trace_id]

    def services(self) -> set[str]:
        with self.lock:
            return {service for service, _ in self.spans}


@pytest.fixture(scope="module")
def traced_stack(random_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[LocalStack, OtlpReceiver, int]]:
    receiver = OtlpReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    otlp_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    verifier_metrics = free_port()
    target, draft = random_pair
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}", "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "100", "MINEDRAFT_TRACE_STEP_EVERY": "1"}
    cfg = StackConfig(target=str(target), draft=str(draft), grpc_port=free_port(), http_port=free_port(), k=3,
                      num_blocks=256, log_dir=tmp_path_factory.mktemp("logs"), extra_env=otel,
                      process_env={"verifier": {"MINEDRAFT_METRICS_PORT": str(verifier_metrics)}})
    stack = LocalStack(cfg)
    try:
        stack.start()
        yield stack, receiver, verifier_metrics
    finally:
        stack.stop()
        server.stop(grace=None)


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(url, timeout=10).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls)


async def grpc_generate(port: int, prompt: list[int], header: str) -> generation_pb2.GenerateResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        request = generation_pb2.GenerateRequest(
            token_ids=generation_pb2.TokenIds(ids=prompt),
            sampling=generation_pb2.SamplingParameters(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
        return await generation_pb2_grpc.GenerationStub(channel).Generate(
            request, metadata=(("traceparent", header),), timeout=120)


async def traffic(stack: LocalStack, headers: list[str]) -> list[int]:
    """Two HTTP completions and one gRPC generation at once (so both batches run); completion tokens."""
    url = f"http://127.0.0.1:{stack.cfg.http_port}/v1/completions"
    async with httpx.AsyncClient(timeout=120) as client:
        def post(prompt: list[int], header: str):  # type: ignore[no-untyped-def]
            body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
            return client.post(url, json=body, headers={"traceparent": header})
        first, second, third = await asyncio.gather(post([5, 6, 7], headers[0]), post([9, 8, 7, 6], headers[1]),
                                                    grpc_generate(stack.cfg.grpc_port, [11, 12], headers[2]))
    return [first.json()["usage"]["completion_tokens"], second.json()["usage"]["completion_tokens"],
            third.usage.completion_tokens]


def test_metrics_and_spans_follow_the_requests(traced_stack: tuple[LocalStack, OtlpReceiver, int]) -> None:
    stack, receiver, verifier_metrics = traced_stack
    base = f"http://127.0.0.1:{stack.cfg.http_port}"
    before = scrape(f"{base}/metrics")
    traces = [traceparent() for _ in range(3)]
    completion_tokens = asyncio.run(traffic(stack, [t[2] for t in traces]))
    assert completion_tokens == [MAX_TOKENS] * 3
    after = scrape(f"{base}/metrics")
    health = httpx.get(f"{base}/health", timeout=5).json()

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert grew("vllm:generation_tokens_total") == sum(completion_tokens)
    assert grew("vllm:prompt_tokens_total") == 3 + 4 + 2
    assert grew("vllm:request_success_total", finished_reason="length") == 3
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                      "vllm:request_queue_time_seconds", "vllm:request_time_per_output_token_seconds"):
        assert grew(f"{histogram}_count") == 3, histogram
    assert grew("vllm:inter_token_latency_seconds_count") > 0
    assert total(after, "vllm:spec_decode_num_accepted_tokens_total") == health["accepted_total"]
    assert total(after, "vllm:spec_decode_num_draft_tokens_total") == health["drafted_total"]
    drafts = total(after, "vllm:spec_decode_num_drafts_total")
    assert total(after, "vllm:spec_decode_num_draft_tokens_total") == 3 * drafts  # k = 3 per draft
    assert grew("minedraft:verify_step_seconds_count") > 0 and grew("minedraft:draft_step_seconds_count") > 0
    assert total(after, "minedraft:overlap_efficiency_count") <= health["steps_by_kind"]["psd"]
    assert total(after, "vllm:num_requests_running") == 0
    assert total(after, "minedraft:mode", mode=health["mode"]) == 1
    assert total(after, "minedraft:draft_link_info", transport="gloo") == 1

    worker = scrape(f"http://127.0.0.1:{verifier_metrics}/metrics")
    assert total(worker, "minedraft:worker_steps_total", role="verifier") > 0
    wait_until(lambda: total(scrape(f"http://127.0.0.1:{verifier_metrics}/metrics"), "minedraft:worker_kv_blocks",
                             state="used") == 0, timeout=30)  # every finished request's KV was freed

    for trace_id, parent_span_id, _ in traces:
        wait_until(lambda t=trace_id: any(s.kind == trace_pb2.Span.SPAN_KIND_SERVER for s in receiver.of_trace(t)),
                   timeout=30)
        spans = receiver.of_trace(trace_id)
        (server_span,) = [s for s in spans if s.kind == trace_pb2.Span.SPAN_KIND_SERVER]
        assert server_span.parent_span_id.hex() == parent_span_id  # the client's traceparent was kept
        attrs = {a.key: a.value for a in server_span.attributes}
        assert attrs["gen_ai.operation.name"].string_value == "text_completion"
        assert attrs["gen_ai.request.model"].string_value == "target"
        assert attrs["gen_ai.usage.output_tokens"].int_value == MAX_TOKENS
        assert [v.string_value for v in attrs["gen_ai.response.finish_reasons"].array_value.values] == ["length"]
        assert "gen_ai.first_token" in {e.name for e in server_span.events}
        (queue,) = [s for s in spans if s.name == "queue"]
        assert queue.parent_span_id == server_span.span_id
        assert server_span.start_time_unix_nano <= queue.end_time_unix_nano <= server_span.end_time_unix_nano
    wait_until(lambda: {"minedraft-verifier", "minedraft-draft"} <= receiver.services(), timeout=30)
