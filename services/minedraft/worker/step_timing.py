"""Per-step timing fields the workers report with each event (step anatomy)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

from minedraft.proto import control_pb2

_annotate = False  # a torch.profiler window is open (worker/torch_profile.py): name the phases in it


def set_annotations(on: bool) -> None:
    global _annotate
    _annotate = on


@contextmanager
def timed(timing: control_pb2.StepTiming, field: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        with torch.profiler.record_function(field) if _annotate else nullcontext():
            yield
    finally:
        setattr(timing, field, getattr(timing, field) + (time.perf_counter() - start) * 1000.0)
