"""Metrics (Prometheus text format, vLLM-compatible names plus PSD's own) and OpenTelemetry traces.

Nothing here is global: each process builds its own registry and tracer and hands them to the
parts that record, so tests can read exactly what one stack recorded.
"""
