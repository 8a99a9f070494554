"""OpenTelemetry traces: one server span per generation request, GenAI semantic conventions.

Off unless the standard environment asks for it (OTEL_TRACES_EXPORTER=otlp|console, or an
OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT), and then configured by the standard OTEL_* variables
(endpoint, headers, service name, resource attributes, sampler). When off, callers hold None
instead of a tracer and do no tracing work at all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

INSTRUMENTATION = "minedraft"


def exporter_from_env() -> SpanExporter | None:
    """The exporter the OTEL_* variables ask for; None when tracing is off (the default)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if kind == "none" or (not kind and not endpoint):
        return None
    if kind == "console":
        return ConsoleSpanExporter()
    if kind not in ("", "otlp"):
        raise ValueError(f"OTEL_TRACES_EXPORTER={kind!r} is not supported; use otlp, console or none")
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol != "grpc":
        raise ValueError(f"OTLP protocol {protocol!r} is not supported; minedraft exports OTLP over gRPC")
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def tracer_from_env(service_name: str) -> trace.Tracer | None:
    """A tracer for this process when the environment turns tracing on, else None."""
    exporter = exporter_from_env()
    if exporter is None:
        return None
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider.get_tracer(INSTRUMENTATION)


class RequestTracer:
    """Starts and finishes the span of one generation request (GenAI conventions, still 'development')."""

    def __init__(self, tracer: trace.Tracer, model_name: str) -> None:
        self.tracer = tracer
        self.model_name = model_name

    def start(self, operation: str, carrier: Mapping[str, str], request_id: str,
              params: Mapping[str, object]) -> Span:
        """`carrier` holds the client's headers or gRPC metadata: a W3C traceparent there is kept."""
        parent = propagate.extract(carrier)
        attributes: dict[str, object] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "minedraft",
            "gen_ai.request.model": self.model_name,
            "minedraft.request_id": request_id,
        }
        attributes.update({f"gen_ai.request.{k}": v for k, v in params.items() if v is not None})
        return self.tracer.start_span(f"{operation} {self.model_name}", context=parent, kind=SpanKind.SERVER,
                                      attributes=attributes)  # type: ignore[arg-type]

    @staticmethod
    def finish(span: Span, finish_reason: str | None, input_tokens: int, output_tokens: int,
               error: BaseException | None = None) -> None:
        span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
        if finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error)))
            span.set_attribute("error.type", type(error).__name__)
        span.end()
