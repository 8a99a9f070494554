"""The ModelRunner of an EAGLE head: every forward takes hidden states beside the tokens.

The head's paged KV cache, block tables and attention metadata are the runner's own; only the step
differs (features in, the output hidden states out as well as the logits). Both kinds of forward of a
proposal replay CUDA graphs per batch bucket:
- the first (the accepted tokens' pairs: the target's states, F wide) one graph per width Q = 1..k+1,
  with each row's query length as data, so a row shorter than Q is padded and the accepted counts never
  change the shape; it reads its [bucket, Q, F] features from one flat static buffer, sized for the
  largest such graph and shared by all of them (the stash gathers straight into it);
- the k-1 feedback forwards (one token per row, the head's own output [B, 1, h] as its state) one graph
  each, over a static [bucket, 1, h] buffer.
The two sets live in two caches, as their keys (bucket, width, logits width) meet at Q = 1 while their
features differ (3h against h for EAGLE-3; an EAGLE-1 head's first forward of one token is a feedback
one), in one memory pool. Every head graph writes its logits into one shared buffer (a replay's rows
are cloned out before the next), so a graph holds no float32 logits of its own. A shape outside the
captured set (a prompt's first proposal, a batch past the buckets) runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minedraft.engine.attention import build_metadata
from minedraft.engine.block_tables import KeptTable
from minedraft.engine.cuda_graphs import BATCH_BUCKETS, MAX_GRAPH_WIDTH, CapturedStep, GraphCache, Out, StepFn
from minedraft.engine.eagle_head import EagleHead
from minedraft.engine.runner import ModelRunner


class PooledGraphCache(GraphCache):
    """A second step function's graphs, captured into another cache's memory pool and staged through its
    pinned ring (a runner's graphs replay one at a time on one stream)."""

    def __init__(self, step_fn: StepFn, owner: GraphCache) -> None:
        super().__init__(step_fn, owner.device, owner.max_blocks_per_seq)
        self.owner = owner
        self.staging = owner.staging

    def capture(self, step: Callable[[], Out]) -> tuple[torch.cuda.CUDAGraph, Out]:
        return self.owner.capture(step)


class EagleRunner(ModelRunner):
    def __init__(self, head: EagleHead, num_blocks: int, block_size: int = 16,
                 device: torch.device | str = "cpu", cuda_graphs: bool = True) -> None:
        super().__init__(head, num_blocks, block_size, device, cuda_graphs=cuda_graphs)  # type: ignore[arg-type]
        self.head = head
        self.fed_back: torch.Tensor | None = None  # the feedback graphs' features [top bucket, 1, h]
        self.first_graphs: GraphCache | None = None  # the first forwards' graphs, keyed (bucket, Q, 1)
        self.first_in: torch.Tensor | None = None  # their features, flat: [bucket, Q, F] of the largest
        self.first_reads: dict[tuple[int, int], torch.Tensor] = {}  # (bucket, Q): the buffer its graph reads
        self.logits_out: torch.Tensor | None = None  # what every head graph writes its logits into, flat
        if self.graphs is not None:
            self.stage_graphs(PooledGraphCache(self.first_graph_step, self.graphs))

    @property
    def feature_width(self) -> int:
        return self.head.eagle.feature_width

    @property
    def graph_capture_ms(self) -> float:
        first = self.first_graphs.capture_ms if self.first_graphs is not None else 0.0
        return super().graph_capture_ms + first

    def stage_graphs(self, first: GraphCache) -> None:
        """The first forwards' cache and the feedback graphs' static buffer (a test staging graphs on the CPU
        hands its own cache)."""
        self.first_graphs = first
        if self.fed_back is None:
            self.fed_back = self._plain(None, BATCH_BUCKETS[-1] * self.config.hidden_size, self.head_dtype).view(
                BATCH_BUCKETS[-1], 1, -1)

    @property
    def head_dtype(self) -> torch.dtype:
        return self.head.embed_tokens.weight.dtype

    def capture_ahead(self, max_batch: int, k: int, scoring: bool = False,
                      selection: tuple[int, int] | None = None) -> int:
        """The graphs of every batch bucket up to `max_batch`: the feedback forwards' ([B, 1] ids and states)
        and the first forwards' of Q = 1..k+1 tokens per row (up to MAX_GRAPH_WIDTH; logits at each row's
        last). The buffers they share are sized for the largest first. Returns how many were new."""
        if self.graphs is None or max_batch <= 0:
            return 0
        top = GraphCache.bucket(max_batch) or BATCH_BUCKETS[-1]
        buckets = [b for b in BATCH_BUCKETS if b <= top]
        self.graph_logits(top)
        captured = self.graphs.capture_ahead((b, 1, 1) for b in buckets)
        if self.first_graphs is None:
            return captured
        widths = [w for w in range(1, min(k + 1, MAX_GRAPH_WIDTH) + 1) if not self.fed_back_width(w)]
        if widths:
            self.first_in = self._plain(self.first_in, top * widths[-1] * self.feature_width, self.head_dtype)
        return captured + self.first_graphs.capture_ahead((b, w, 1) for b in buckets for w in widths)

    def fed_back_width(self, width: int) -> bool:
        """Whether a first forward of this width is a feedback one (one token, features of the head's width)."""
        return width == 1 and self.feature_width == self.config.hidden_size

    def first_features(self, batch: int, width: int, table_width: int = 0) -> torch.Tensor | None:
        """Where a first forward of this shape leaves its features for its graph ([batch, width, F], a view of the
        static buffer that graph reads); None when no first-forward graph takes the shape."""
        first = self.first_graphs
        if first is None or self.fed_back_width(width) or not first.can_replay(batch, width, 1, table_width):
            return None
        bucket = GraphCache.bucket(batch)
        assert bucket is not None
        return self._first_buffer(bucket, width)[: batch * width * self.feature_width].view(batch, width, -1)

    @torch.inference_mode()
    def forward_features(self, seq_ids: list[int], ids: torch.Tensor, features: torch.Tensor,
                         starts: list[int] | torch.Tensor, query_lens: list[int] | torch.Tensor,
                         reserve: list[int], last_n: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ids [B, Q] with features [B, Q, F] at starts; (logits [B, last_n, V], hidden [B, last_n, h])
        of each row's last `last_n` fed positions. `reserve[b]` bounds row b's positions (KV blocks)."""
        alloc = self.cache.allocator
        if (seq_ids, reserve, alloc.version) != self._reserved:  # the k-1 feeds after the first: already there
            for seq_id, limit in zip(seq_ids, reserve, strict=True):
                alloc.ensure(seq_id, limit)
            self._reserved = (list(seq_ids), list(reserve), alloc.version)
        kept = self.tables.get(seq_ids)
        step = self.launch_graph(ids, features, starts, query_lens, kept) if last_n == 1 else None
        if step is not None:
            return step.logits[: ids.shape[0]].clone(), step.extras[0][: ids.shape[0]].clone()
        if kept.device is None:  # one upload per revision of the table: a proposal's k forwards share one
            kept.device = self.to_device(kept.host)
        if not isinstance(starts, torch.Tensor):
            starts = self.to_device(torch.tensor(starts, dtype=torch.long))
        if not isinstance(query_lens, torch.Tensor):
            query_lens = self.to_device(torch.tensor(query_lens, dtype=torch.long))
        return self.head_step(ids, features, starts, query_lens, kept.device, last_n)

    def launch_graph(self, ids: torch.Tensor, features: torch.Tensor, starts: list[int] | torch.Tensor,
                     query_lens: list[int] | torch.Tensor, kept: KeptTable) -> CapturedStep | None:
        """Replay this forward's graph, its features put in the buffer the graph reads first (unless they are
        there already); None when no graph takes the shape."""
        (batch, width), table_width = ids.shape, kept.host.shape[1]
        graphs, bucket = self.graphs, GraphCache.bucket(batch)
        if graphs is None or bucket is None:
            return None
        self.graph_logits(bucket)  # a graph captured now finds its outputs' buffer there already
        if features.shape[-1] == self.config.hidden_size and width == 1:  # a fed-back state
            if self.fed_back is None or not graphs.can_replay(batch, 1, 1, table_width):
                return None
            self.fed_back[:batch].copy_(features)
            return graphs.launch(ids, starts, query_lens, kept.host, 1, kept.revision)
        slot = self.first_features(batch, width, table_width) if features.shape[-1] == self.feature_width else None
        if slot is None or self.first_graphs is None:
            return None
        if slot.data_ptr() != features.data_ptr() or slot.shape != features.shape:
            slot.copy_(features)
        return self.first_graphs.launch(ids, starts, query_lens, kept.host, 1, kept.revision)

    def graph_step(self, ids: torch.Tensor, starts: torch.Tensor, query_lens: torch.Tensor, tables: torch.Tensor,
                   last_n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A feedback graph's step: the rows of the static features buffer that its bucket holds."""
        assert self.fed_back is not None
        return self.head_step(ids, self.fed_back[: ids.shape[0]], starts, query_lens, tables, last_n,
                              self.graph_logits(ids.shape[0], last_n))

    def first_graph_step(self, ids: torch.Tensor, starts: torch.Tensor, query_lens: torch.Tensor,
                         tables: torch.Tensor, last_n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A first forward's graph step: [bucket, Q, F] of the flat features buffer, which it records as its own."""
        bucket, width = ids.shape
        buffer = self.first_reads[(bucket, width)] = self._first_buffer(bucket, width)
        features = buffer[: bucket * width * self.feature_width].view(bucket, width, -1)
        return self.head_step(ids, features, starts, query_lens, tables, last_n, self.graph_logits(bucket, last_n))

    @torch.inference_mode()
    def head_step(self, ids: torch.Tensor, features: torch.Tensor, starts: torch.Tensor, query_lens: torch.Tensor,
                  tables: torch.Tensor, last_n: int, out: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's step on device tensors only: logits [B, last_n, V] (into `out` when given) and output
        hidden [B, last_n, h]."""
        meta = build_metadata(starts, query_lens, ids.shape[1], tables, self.cache.block_size,
                              self.config.sliding_window, self.backend)
        pick = (query_lens.unsqueeze(1) - last_n + torch.arange(last_n, device=ids.device)).clamp(min=0)
        hidden = self.head(ids, features, meta, self.cache.layers, pick)
        return self.head.logits(hidden, out), hidden

    def graph_logits(self, bucket: int, last_n: int = 1) -> torch.Tensor:
        """[bucket, last_n, V] of the logits buffer the head's graphs share, grown to hold it (graphs captured
        before keep the one they write)."""
        vocab = self.config.vocab_size
        self.logits_out = self._plain(self.logits_out, bucket * last_n * vocab, torch.float32)
        return self.logits_out[: bucket * last_n * vocab].view(bucket, last_n, vocab)

    def _first_buffer(self, bucket: int, width: int) -> torch.Tensor:
        """The flat features buffer of the (bucket, width) graph: the one it was captured over, or (not captured
        yet) the shared one, grown to hold it."""
        held = self.first_reads.get((bucket, width))
        if held is not None:
            return held
        self.first_in = self._plain(self.first_in, bucket * width * self.feature_width, self.head_dtype)
        return self.first_in

    def _plain(self, held: torch.Tensor | None, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """`held` when it has numel values, else a new zero buffer (a plain tensor: written from outside
        inference mode too)."""
        if held is not None and held.numel() >= numel:
            return held
        with torch.inference_mode(False):
            return torch.zeros(numel, dtype=dtype, device=self.device)
