"""A worker's own figures (verifier or draft service): step anatomy histograms, KV and sequence
gauges on its /metrics, and sampled step spans.

Step spans are sampled (one step in `trace_every`) because a worker runs hundreds of steps a
second; each carries `minedraft.step`, the id the batch manager's plans and events use, so a
slow step can be joined with the requests verified in it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from minedraft.observability.metrics import STEP_BUCKETS
from minedraft.proto import control_pb2

STEP_PARTS = ("compute_ms", "recv_wait_ms", "send_ms", "control_ms", "plan_wait_ms")


class WorkerTelemetry:
    """Records every executed step; `info` is read at scrape time for the KV gauges."""

    def __init__(self, role: str, info: Callable[[], control_pb2.WorkerInfo], tracer: trace.Tracer | None = None,
                 trace_every: int = 100, registry: CollectorRegistry | None = None) -> None:
        self.role = role
        self.tracer = tracer
        self.trace_every = max(1, trace_every)
        self.registry = registry or CollectorRegistry()
        self.step_parts = Histogram("minedraft:worker_step_part_seconds",
                                    "Where a worker's step time goes: compute, waiting on the data plane, "
                                    "sending, plan bookkeeping, idle before the plan.",
                                    ["role", "part"], buckets=STEP_BUCKETS, registry=self.registry)
        self.steps = Counter("minedraft:worker_steps", "Steps this worker executed.", ["role"], registry=self.registry)
        self.graph_capture = Counter("minedraft:worker_graph_capture_seconds",
                                     "Time steps spent capturing CUDA graphs of new shapes (none once every shape "
                                     "was captured; --capture-batch takes them at start-up).", ["role"],
                                     registry=self.registry)
        self.registry.register(_KvGauges(role, info))

    def step(self, plan: control_pb2.StepPlan, event: control_pb2.WorkerEvent, start_ns: int, end_ns: int) -> None:
        self.steps.labels(self.role).inc()
        if event.timing.graph_capture_ms:
            self.graph_capture.labels(self.role).inc(event.timing.graph_capture_ms / 1000.0)
        for part in STEP_PARTS:
            self.step_parts.labels(self.role, part.removesuffix("_ms")).observe(getattr(event.timing, part) / 1000.0)
        if self.tracer is not None and plan.step % self.trace_every == 0:
            span = self.tracer.start_span(f"{self.role} step", start_time=start_ns, attributes={
                "minedraft.step": plan.step, "minedraft.role": self.role, "minedraft.k": plan.k,
                "minedraft.with_drafts": plan.with_drafts, "minedraft.batch": event.timing.batch,
                "minedraft.draft_batch": len(plan.draft_batch), "minedraft.verify_batch": len(plan.verify_batch),
                **{f"minedraft.{part}": getattr(event.timing, part) for part in STEP_PARTS},
            })
            if event.error:
                span.set_status(trace.Status(trace.StatusCode.ERROR, event.error))
            span.end(end_time=end_ns)


class _KvGauges(Collector):
    def __init__(self, role: str, info: Callable[[], control_pb2.WorkerInfo]) -> None:
        self.role = role
        self.info = info

    def collect(self) -> Iterator[GaugeMetricFamily]:
        info = self.info()
        blocks = GaugeMetricFamily("minedraft:worker_kv_blocks", "This worker's paged KV cache blocks by state.",
                                   labels=["role", "state"])
        blocks.add_metric([self.role, "free"], float(info.free_blocks))
        blocks.add_metric([self.role, "used"], float(info.num_blocks - info.free_blocks))
        yield blocks
        seqs = GaugeMetricFamily("minedraft:worker_sequences", "Sequences this worker holds KV for.", labels=["role"])
        seqs.add_metric([self.role], float(info.sequences))
        yield seqs
