"""CUDA graphs for fixed-width steps (draft decode, verify windows) at bucketed batch sizes.

A graph is captured per (batch bucket, query width, logits width) on first use, over
static input buffers; a smaller batch is padded to its bucket with zero-length rows,
which write no KV and whose logits are dropped. Logits are copied out of the graph's
buffer so the next replay cannot overwrite what a caller still holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minedraft.engine.runner import ModelRunner

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
MAX_GRAPH_WIDTH = 16


@dataclass(slots=True)
class CapturedStep:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor
    starts: torch.Tensor
    query_lens: torch.Tensor
    tables: torch.Tensor
    logits: torch.Tensor


class GraphCache:
    """Captured steps of one runner, keyed by (bucket, width, last_n)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.steps: dict[tuple[int, int, int], CapturedStep] = {}
        self.pool: tuple | None = None

    @staticmethod
    def bucket(batch: int) -> int | None:
        return next((b for b in BATCH_BUCKETS if b >= batch), None)

    def can_replay(self, batch: int, width: int, last_n: int, table_width: int) -> bool:
        return (
            self.bucket(batch) is not None
            and width <= MAX_GRAPH_WIDTH
            and last_n <= width
            and table_width <= self.runner.max_blocks_per_seq
        )

    def replay(
        self, ids: torch.Tensor, starts: torch.Tensor, query_lens: torch.Tensor, tables: torch.Tensor, last_n: int
    ) -> torch.Tensor:
        """Inputs are device tensors (device-to-device copies into the static buffers)."""
        batch, width = ids.shape
        bucket = self.bucket(batch)
        assert bucket is not None
        key = (bucket, width, last_n)
        step = self.steps.get(key) or self._capture(key)
        step.ids[batch:].zero_()
        step.ids[:batch].copy_(ids)
        step.starts.zero_()
        step.starts[:batch].copy_(starts)
        step.query_lens.zero_()
        step.query_lens[:batch].copy_(query_lens)
        step.tables.zero_()
        step.tables[:batch, : tables.shape[1]].copy_(tables)
        step.graph.replay()
        return step.logits[:batch].clone()

    def _capture(self, key: tuple[int, int, int]) -> CapturedStep:
        bucket, width, last_n = key
        device = self.runner.device
        ids = torch.zeros((bucket, width), dtype=torch.long, device=device)
        starts = torch.zeros(bucket, dtype=torch.long, device=device)
        lens = torch.zeros(bucket, dtype=torch.long, device=device)
        tables = torch.zeros((bucket, self.runner.max_blocks_per_seq), dtype=torch.long, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: Triton compiles and autotunes outside the capture
                self.runner.run(ids, starts, lens, tables, last_n)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.runner.run(ids, starts, lens, tables, last_n)
        self.pool = graph.pool()
        step = CapturedStep(graph, ids, starts, lens, tables, logits)
        self.steps[key] = step
        return step
