"""One server span per generation request, around the backend's chunk stream.

Both public APIs (HTTP and gRPC) wrap their backend stream with `traced_stream`: the span
starts from the client's W3C `traceparent` (headers or gRPC metadata), gets a child span for
the time in the queue and an event at the first token (from the request's own timings, carried
by its last chunk), and ends with the usage and finish reason, or with the error that ended it.
While it runs, log records of this task carry the request id and the trace id.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing

from opentelemetry import trace
from opentelemetry.trace import Span

from minedraft.batch_manager.backend import GenerationChunk
from minedraft.core.request import RequestStats
from minedraft.core.sampling_params import SamplingParams
from minedraft.observability.logs import current_request_id, current_trace_id
from minedraft.observability.tracing import RequestTracer


def request_attributes(params: SamplingParams) -> dict[str, object]:
    """GenAI request attributes (gen_ai.request.*) of the sampling parameters."""
    return {"max_tokens": params.max_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k or None, "seed": params.seed}


def bind_request_logs(request_id: str, span: Span | None) -> None:
    """Log records of the current task name this request (and its trace, when traced)."""
    current_request_id.set(request_id)
    if span is not None:
        current_trace_id.set(format(span.get_span_context().trace_id, "032x"))


def traced_stream(stream: AsyncIterator[GenerationChunk], tracer: RequestTracer | None, operation: str,
                  carrier: Callable[[], Mapping[str, str]], request_id: str, params: SamplingParams
                  ) -> AsyncIterator[GenerationChunk]:
    """`stream` with the request's span around it; with tracing off, `stream` itself (no wrapper,
    and the carrier, the client's headers or metadata, is never read)."""
    if tracer is None:
        bind_request_logs(request_id, None)
        return stream
    span = tracer.start(operation, carrier(), request_id, request_attributes(params))
    bind_request_logs(request_id, span)
    return _spanned(stream, tracer, span)


async def _spanned(stream: AsyncIterator[GenerationChunk], tracer: RequestTracer, span: Span
                   ) -> AsyncIterator[GenerationChunk]:
    last: GenerationChunk | None = None
    error: BaseException | None = None
    try:
        async with aclosing(stream):  # closing this wrapper must close (abort) the backend stream too
            async for chunk in stream:
                last = chunk
                yield chunk
    except BaseException as exc:  # validation, queue full, unavailable, client gone: all end the span
        error = exc
        raise
    finally:
        if last is not None and last.stats is not None:
            _timeline(tracer.tracer, span, last.stats)
        tracer.finish(span, last.finish_reason if last else None, last.prompt_tokens if last else 0,
                      last.completion_tokens if last else 0, error)


def _timeline(tracer: trace.Tracer, span: Span, stats: RequestStats) -> None:
    """The queue as a child span and the first token as an event, at the times they happened."""
    start = stats.started_ns
    admitted = stats.wall_ns(stats.admitted)
    if admitted is not None:
        queue = tracer.start_span("queue", context=trace.set_span_in_context(span), start_time=start)
        queue.end(end_time=admitted)
    first = stats.wall_ns(stats.first_token)
    if first is not None:
        span.add_event("gen_ai.first_token", timestamp=first)
        span.set_attribute("gen_ai.server.time_to_first_token", (first - start) / 1e9)
    span.set_attribute("minedraft.steps", stats.steps)
    span.set_attribute("minedraft.first_step", stats.first_step)  # joins with the workers' sampled step spans
    span.set_attribute("minedraft.last_step", stats.last_step)
    span.set_attribute("minedraft.draft_tokens", stats.drafted)
    span.set_attribute("minedraft.accepted_tokens", stats.accepted)
