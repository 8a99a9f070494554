"""CUDA graphs for fixed-width steps (draft decode, verify windows) at bucketed batch sizes.

A graph is captured per (batch bucket, query width, logits width) on first use, over
static input buffers; a smaller batch is padded to its bucket with zero-length rows,
which write no KV and whose logits are dropped. Logits are copied out of the graph's
buffer so the next replay cannot overwrite what a caller still holds; a plain step's buffer holds them in
the head's dtype and the copy widens them to float32.

A capture costs tens of milliseconds on an 8B model, so a step that meets a new shape is that much
slower: `capture_ms` counts it (workers report it per step, and adaptive k must not take such a step
for the cost of its k), and `capture_ahead` takes every steady-state shape up front, as a server
should before its first request. After it the set is closed: any other shape (a prefill of a short
prompt, a batch beyond the captured buckets) runs eagerly, which costs that step a millisecond or two
of launches instead of a capture that may never be replayed.

A step may return more than its logits (a tuple, logits first): the capturing verifier's features, an
EAGLE head's output hidden states. They stay in the graph's own buffers; `launch` hands the step back so
its owner reads (and clones) them before the next replay.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch

from minedraft.engine import blas_plan
from minedraft.engine.staging import StagingRing

log = logging.getLogger(__name__)

# What a graph captures: (ids, starts, query_lens, tables, last_n) -> logits, or (logits, *more outputs), device
# tensors only.
StepOut = torch.Tensor | tuple[torch.Tensor, ...]
StepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], StepOut]

Out = TypeVar("Out")

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
MAX_GRAPH_WIDTH = 16


@dataclass(slots=True)
class CapturedStep:
    run: Callable[[], object]  # the step over the static buffers (what the graph holds; staged, what a replay runs)
    ids: torch.Tensor
    meta: torch.Tensor  # [starts (bucket) | query_lens (bucket) | tables (bucket x max_blocks)], int64
    logits: torch.Tensor
    extras: tuple[torch.Tensor, ...] = ()  # the step's outputs after its logits, [bucket, ...] each
    graph: torch.cuda.CUDAGraph | None = None  # None: staged without CUDA (tests), `run` stands in for it
    table_revision: int | None = None  # the block tables' revision the meta buffer holds (None: unknown)
    batch: int = 0  # the batch of the last replay (rows past it have zero-length queries)


def split_meta(meta: torch.Tensor, bucket: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views of one packed buffer: starts, query lengths, block tables (all contiguous)."""
    return meta[:bucket], meta[bucket : 2 * bucket], meta[2 * bucket :].view(bucket, -1)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a graph is captured: should it free an unreachable runner's graphs
    mid-capture, destroying them is an operation a capturing stream forbids, and the capture is lost. What
    becomes garbage meanwhile waits for the next collection outside a capture."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class GraphCache:
    """Captured steps of one model step function, keyed by (bucket, width, last_n).

    It gets the step function and the shapes it needs rather than the runner, so the runner
    owns a cache without the two modules importing each other.
    """

    def __init__(self, step_fn: StepFn, device: torch.device, max_blocks_per_seq: int) -> None:
        self.step_fn = step_fn
        self.device = device
        self.max_blocks_per_seq = max_blocks_per_seq
        self.steps: dict[tuple[int, int, int], CapturedStep] = {}
        self.pool: tuple | None = None
        self.capture_ms = 0.0  # host time spent capturing, in total
        self.closed = False  # capture_ahead ran: only its shapes replay, nothing is captured while serving
        self.eager: set[tuple[int, ...]] = set()  # shapes outside the closed set met so far (packed ones too)
        self.staging = StagingRing(device)  # pinned buffers the host metadata travels through
        self.replays = 0  # fixed-width steps replayed so far

    def capture_ahead(self, keys: Iterable[tuple[int, int, int]]) -> int:
        """Capture these (bucket, width, last_n) now and close the set; returns how many were new."""
        new = [key for key in dict.fromkeys(keys) if key not in self.steps]
        for key in new:
            self._capture(key)
        self.closed = True
        return len(new)

    @staticmethod
    def bucket(batch: int) -> int | None:
        return next((b for b in BATCH_BUCKETS if b >= batch), None)

    def can_replay(self, batch: int, width: int, last_n: int, table_width: int) -> bool:
        bucket = self.bucket(batch)
        fits = (bucket is not None and width <= MAX_GRAPH_WIDTH and last_n <= width
                and table_width <= self.max_blocks_per_seq)
        if not fits or not self.closed or (bucket, width, last_n) in self.steps:
            return fits
        self.say_eager((bucket, width, last_n), f"step of up to {bucket} sequences x {width} tokens (logits for "
                                                f"{last_n})")
        return False

    def say_eager(self, shape: tuple[int, ...], step: str) -> None:
        """Log that a step outside the closed set runs eagerly, once per shape (a prefill's, or a k or batch past
        the bounds)."""
        if shape not in self.eager:
            self.eager.add(shape)
            log.info("%s runs eagerly: not among the CUDA graphs captured at start-up (--capture-batch, "
                     "--capture-k)", step)

    def replay(
        self, ids: torch.Tensor, starts: list[int] | torch.Tensor, query_lens: list[int] | torch.Tensor,
        tables: torch.Tensor, last_n: int, table_revision: int | None = None,
    ) -> torch.Tensor:
        """The float32 logits [B, last_n, V] of the step `launch` replays, copied out of the graph's buffer."""
        logits = self.launch(ids, starts, query_lens, tables, last_n, table_revision).logits[: ids.shape[0]]
        return logits.clone() if logits.dtype == torch.float32 else logits.float()

    def launch(
        self, ids: torch.Tensor, starts: list[int] | torch.Tensor, query_lens: list[int] | torch.Tensor,
        tables: torch.Tensor, last_n: int, table_revision: int | None = None,
    ) -> CapturedStep:
        """Replay the step of this shape (captured first while the set is open) and return it: its outputs
        hold the first B rows until the next replay of the same step.

        ids: device tensor [B, Q]; the [B, w] block tables come from the host; starts and query_lens from
        the host too, or as device tensors when only the device knows them yet (a verdict in flight).

        Host metadata travels through a reused pinned buffer (engine/staging.py) in asynchronous copies; the
        tables only when `table_revision` (engine/block_tables.py) differs from the one this graph's buffer
        already holds, so the draft's follow-up forwards send none. Device starts and lengths are copied
        device to device. Rows past the batch get zero-length queries (they read and write nothing, so their
        stale table rows, like the columns past a row's width, are never looked at).
        """
        batch, width = ids.shape
        bucket = self.bucket(batch)
        assert bucket is not None
        key = (bucket, width, last_n)
        step = self.steps.get(key) or self._capture(key)
        starts_dev, lens_dev, tables_dev = split_meta(step.meta, bucket)
        on_device = isinstance(starts, torch.Tensor)
        send_table = table_revision is None or table_revision != step.table_revision
        if not on_device or send_table:
            w = tables.shape[1]
            heads = 0 if on_device else 2 * bucket
            buf, view = self.staging.take(heads + batch * w)
            if not on_device:
                view[: 2 * bucket] = 0
                view[:batch] = starts
                view[bucket : bucket + batch] = query_lens
                step.meta[: 2 * bucket].copy_(buf[: 2 * bucket], non_blocking=True)
            if send_table:
                view[heads : heads + batch * w] = tables.numpy().reshape(-1)
                tables_dev[:batch, :w].copy_(buf[heads : heads + batch * w].view(batch, w), non_blocking=True)
                step.table_revision = table_revision
            self.staging.sent()
        if on_device:
            if step.batch != batch:  # rows past this batch must have zero-length queries
                step.meta[: 2 * bucket].zero_()
            starts_dev[:batch].copy_(starts)
            lens_dev[:batch].copy_(query_lens)
        step.batch = batch
        step.ids[:batch].copy_(ids)
        if step.graph is not None:
            step.graph.replay()
        else:
            step.run()
        self.replays += 1
        return step

    def capture(self, step: Callable[[], Out]) -> tuple[torch.cuda.CUDAGraph, Out]:
        """A graph of `step` (a closure over static buffers) in this cache's memory pool, and its output.

        Every graph of the runner shares the one pool (the packed verifies' too, engine/ragged_graphs.py):
        they replay one at a time on one stream, so what one frees at the end of its capture the next reuses."""
        device = self.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        blas = blas_plan.plan()
        with torch.cuda.stream(side), blas.choosing():  # warm-up: Triton compiles and autotunes outside the capture
            step()  # meets each GEMM shape: the BLAS library is chosen for the new ones (engine/blas_plan.py)
            blas.settle()
            step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with blas.choosing(), torch.cuda.graph(graph, pool=self.pool), collector_paused():
            out = step()
        self.pool = graph.pool()
        return graph, out

    def stage(self, key: tuple[int, int, int]) -> CapturedStep:
        """Static buffers for a key and the step over them, which sets the step's outputs (what `_capture`
        records as a graph; a test without CUDA may keep it as it is)."""
        bucket, width, last_n = key
        ids = torch.zeros((bucket, width), dtype=torch.long, device=self.device)
        meta = torch.zeros(bucket * (2 + self.max_blocks_per_seq), dtype=torch.long, device=self.device)
        starts, lens, tables = split_meta(meta, bucket)

        def run() -> None:
            out = self.step_fn(ids, starts, lens, tables, last_n)
            step.logits, *extras = out if isinstance(out, tuple) else (out,)
            step.extras = tuple(extras)

        step = CapturedStep(run, ids, meta, ids)  # logits: set by the first run
        return step

    def _capture(self, key: tuple[int, int, int]) -> CapturedStep:
        started = time.perf_counter()
        step = self.stage(key)
        step.graph, _ = self.capture(step.run)  # the capture's run leaves the graph's outputs on the step
        self.steps[key] = step
        self.capture_ms += (time.perf_counter() - started) * 1000.0
        return step
