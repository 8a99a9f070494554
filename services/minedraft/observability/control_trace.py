"""Timestamps along the control plane, for finding where a plan's round trip goes (MINEDRAFT_CONTROL_TRACE).

With the variable set to a folder, the batch manager and each worker append `point step ns` lines to
`<folder>/<role>-<pid>.txt` at the points below (CLOCK_MONOTONIC, so processes on one host compare).
`python -m minedraft.bench.control_trace_report <folder>` turns them into the round trip's parts. It
answered why SD colocated waits for its verify plans on an H200 (2026-12-01); off, a mark is one check.

    worker:  arrive  the inbox took plan `step` off the gRPC stream
             begin   the loop started plan `step`          end   its event was queued for the stream
             out     the gRPC handler took that event       sent  ... and gRPC asked for the next one
    manager: verdict the verifier's event for `step` came in
             plan    plan `step` was queued for the verifier's stream   write  gRPC took it to send
"""

from __future__ import annotations

import atexit
import os
import time

ENV = "MINEDRAFT_CONTROL_TRACE"
FLUSH_EVERY = 256


class _Trace:
    def __init__(self) -> None:
        self.folder: str | None = None  # None until the first mark reads the environment
        self.role = "manager"
        self.lines: list[str] = []

    def start(self) -> None:
        self.folder = os.environ.get(ENV, "")
        if self.folder:
            os.makedirs(self.folder, exist_ok=True)
            atexit.register(self.flush)

    def flush(self) -> None:
        lines, self.lines = self.lines, []  # marks from other threads go to the new list meanwhile
        if self.folder and lines:
            path = os.path.join(self.folder, f"{self.role}-{os.getpid()}.txt")
            with open(path, "a", encoding="ascii") as out:
                out.writelines(lines)


_trace = _Trace()


def set_role(role: str) -> None:
    """Name this process's file (a worker calls it when its loop starts)."""
    _trace.flush()  # lines so far keep the name they were taken under
    _trace.role = role


def mark(point: str, step: int) -> None:
    if _trace.folder is None:
        _trace.start()
    if not _trace.folder:
        return
    _trace.lines.append(f"{point} {step} {time.perf_counter_ns()}\n")
    if len(_trace.lines) >= FLUSH_EVERY:
        _trace.flush()


def flush() -> None:
    _trace.flush()


def restart() -> None:
    """Write what is held, then read MINEDRAFT_CONTROL_TRACE again at the next mark (a process reads it once)."""
    _trace.flush()
    _trace.folder = None
