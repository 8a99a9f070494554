"""Ends a tensor-parallel rank whose wait for its GPU never returns.

NCCL's watchdog follows the collectives a process group launches, not those replayed inside a CUDA
graph, and a captured verify step replays its all-reduces. So when one rank of a tensor-parallel group
dies during a step, the other ranks' all-reduce kernels wait for it forever, and so does each survivor's
host on that step's readback: rank 0 never reaches the host channel (whose broken socket would end a
follower), a follower never reaches its next receive. A rank under this watch exits instead once one such
wait outlasts `limit_s` (the group's timeout, what the watchdog allows an eager collective), so the
launcher or Kubernetes restarts the group.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

log = logging.getLogger(__name__)

EXIT_STALLED = 70  # EX_SOFTWARE: the process ended itself


def exit_stalled(label: str, waited_s: float) -> None:
    log.critical("%s has waited %.0f s for the GPU: a tensor-parallel peer is gone; exiting so the group "
                 "restarts", label, waited_s)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_STALLED)  # the stuck kernels end with the process's CUDA context


class StallWatch:
    def __init__(self, limit_s: float, on_stall: Callable[[str, float], None] = exit_stalled,
                 poll_s: float | None = None) -> None:
        self.limit_s = limit_s
        self.on_stall = on_stall
        self.poll_s = poll_s if poll_s is not None else min(5.0, limit_s / 10)
        self._since: float | None = None  # when the current wait began; None between waits
        self._label = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        self._thread.start()

    @contextmanager
    def waiting(self, label: str) -> Iterator[None]:
        """Around one wait for the GPU (two attribute writes: cheap enough for every step)."""
        self._label = label
        self._since = time.monotonic()
        try:
            yield
        finally:
            self._since = None

    @staticmethod
    def around(watch: StallWatch | None, label: str) -> AbstractContextManager[None]:
        """`watch.waiting(label)`, or nothing where no watch is kept (no tensor parallelism)."""
        return watch.waiting(label) if watch is not None else nullcontext()

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            since = self._since
            if since is not None and (waited := time.monotonic() - since) > self.limit_s:
                self.on_stall(self._label, waited)
                return
