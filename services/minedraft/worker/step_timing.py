"""Per-step timing fields the workers report with each event (step anatomy)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from minedraft.proto import control_pb2


@contextmanager
def timed(timing: control_pb2.StepTiming, field: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        setattr(timing, field, getattr(timing, field) + (time.perf_counter() - start) * 1000.0)
