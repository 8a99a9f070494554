"""Runs one model over a batch of sequences that each bring some new tokens.

The runner owns the model and its paged KV cache. A forward call says, per sequence,
which tokens to feed and at which position the first of them sits; the runner grows
block tables, builds the attention metadata, and returns logits for the last positions
asked for. Prefill chunks, single-token decodes and k+1-token verify windows share
this one path. On CUDA, attention runs in Triton kernels and fixed-width steps (draft
decode, verify windows) replay CUDA graphs captured at bucketed batch sizes.
"""

from __future__ import annotations

import torch

from minedraft.engine.attention import build_metadata
from minedraft.engine.block_tables import BlockTables, KeptTable
from minedraft.engine.cuda_graphs import BATCH_BUCKETS, MAX_GRAPH_WIDTH, GraphCache
from minedraft.engine.hidden_rows import HiddenRows
from minedraft.engine.kv_cache import BlockAllocator, KVCache
from minedraft.engine.model import CausalLM
from minedraft.engine.ragged_graphs import PackedGraphs, PackedStep, selection_keys
from minedraft.engine.transfer import to_device

TABLE_MULTIPLE = 16  # block-table width granularity on the Triton path (kv_cache.block_table_tensor)


def attention_backend(device: torch.device) -> str:
    if device.type != "cuda":
        return "torch"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "torch"
    return "triton"


class ModelRunner:
    """A model plus its KV cache on one device."""

    def __init__(
        self,
        model: CausalLM,
        num_blocks: int,
        block_size: int = 16,
        device: torch.device | str = "cpu",
        kv_dtype: torch.dtype | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        self.model = model
        self.config = model.config
        self.device = torch.device(device)
        dtype = kv_dtype or next(model.parameters()).dtype
        self.cache = KVCache(model.config, num_blocks, block_size, self.device, dtype)
        self.backend = attention_backend(self.device)
        self.max_blocks_per_seq = -(-(self.config.max_position_embeddings + 64) // block_size)
        self.tables = BlockTables(self.cache.allocator, TABLE_MULTIPLE if self.backend == "triton" else 1,
                                  self.max_blocks_per_seq)  # kept between forwards, updated row by row
        self._reserved: tuple[list[int], list[int], int] = ([], [], -1)  # the last ensure: ids, limits, version
        use_graphs = cuda_graphs and self.backend == "triton"
        self.graphs = GraphCache(self.graph_step, self.device, self.max_blocks_per_seq) if use_graphs else None
        self.packed_graphs = (None if self.graphs is None else  # TETRIS's packed verifies (engine/ragged.py)
                              PackedGraphs(self.graphs, PackedStep(model, self.cache, self.backend),
                                           self.config.vocab_size))

    @property
    def packs_verifies(self) -> bool:
        """Whether the step is the plain one, which a packed (ragged) verify may stand in for: a runner with its
        own step (hidden-state capture) verifies ragged rows padded (engine/ragged.py)."""
        return type(self).run is ModelRunner.run

    @property
    def allocator(self) -> BlockAllocator:
        return self.cache.allocator

    @property
    def graph_capture_ms(self) -> float:
        """Host time spent capturing CUDA graphs so far (0 without graphs)."""
        return self.graphs.capture_ms if self.graphs is not None else 0.0

    def capture_ahead(self, max_batch: int, k: int, scoring: bool, selection: tuple[int, int] | None = None) -> int:
        """Capture now the graph of every steady-state step of up to `max_batch` sequences and k drafts: a
        verifier's windows of 1..k+1 tokens, logits at every position (`scoring`), or a drafter's feeds of
        1..k+1 tokens, logits at the last. With `selection` (tetris_extra, tetris_min_batch) a verifier also
        captures the packed verifies TETRIS takes at each of those k (engine/ragged_graphs.py). Other shapes
        then run eagerly, never captured while serving. Tensor-parallel ranks must all call it alike (the
        graphs hold all-reduces, and every rank must take the same path for a step). Returns how many were
        new; 0 without graphs."""
        if self.graphs is None or max_batch <= 0:
            return 0
        top = GraphCache.bucket(max_batch) or BATCH_BUCKETS[-1]
        widths = range(1, min(k + 1, MAX_GRAPH_WIDTH) + 1)
        captured = self.graphs.capture_ahead((b, w, w if scoring else 1) for b in BATCH_BUCKETS if b <= top
                                             for w in widths)
        if selection is not None and scoring and self.packs_verifies and self.packed_graphs is not None:
            captured += self.packed_graphs.capture_ahead(selection_keys(top, k, *selection))
        return captured

    def forward(self, seq_ids: list[int], tokens: list[list[int]], starts: list[int], last_n: int,
                reserve: list[int] | None = None) -> torch.Tensor:
        """Feed tokens[b] at positions starts[b].. and return logits [B, last_n, V].

        Row b's logits are those of its last `last_n` fed tokens; rows that fed fewer
        repeat their first position (callers never read those). `reserve[b]` (at least row b's
        last position + 1) has the KV blocks of the forwards to come made now, as a drafter's
        k feeds need: their forwards then find the tables ready and unchanged.
        """
        lens = [len(t) for t in tokens]
        width = max(lens)
        ids = torch.tensor([t + [0] * (width - len(t)) for t in tokens], dtype=torch.long)
        if reserve is None:
            return self.forward_ids(seq_ids, self.to_device(ids), starts, lens, last_n)
        return self.forward_on_device(seq_ids, self.to_device(ids), starts, lens, reserve, last_n)

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        return to_device(host, self.device)

    def forward_ids(
        self, seq_ids: list[int], ids: torch.Tensor, starts: list[int], query_lens: list[int], last_n: int
    ) -> torch.Tensor:
        """Like `forward`, with the token ids already a [B, Q] tensor on the device."""
        limits = [start + n for start, n in zip(starts, query_lens, strict=True)]
        return self.forward_on_device(seq_ids, ids, starts, query_lens, limits, last_n)

    def forward_on_device(
        self, seq_ids: list[int], ids: torch.Tensor, starts: list[int] | torch.Tensor,
        query_lens: list[int] | torch.Tensor, reserve: list[int], last_n: int,
    ) -> torch.Tensor:
        """Like `forward_ids`, where starts and query lengths may be device tensors that only the device knows
        yet (computed from a verdict in flight); `reserve[b]` bounds row b's last position + 1, so its KV
        blocks exist before the step is queued."""
        alloc = self.cache.allocator
        if (seq_ids, reserve, alloc.version) != self._reserved:  # the draft's follow-up forwards: already there
            for seq_id, limit in zip(seq_ids, reserve, strict=True):
                alloc.ensure(seq_id, limit)
            self._reserved = (list(seq_ids), list(reserve), alloc.version)
        kept = self.tables.get(seq_ids)
        if self.graphs is not None and self.graphs.can_replay(len(seq_ids), ids.shape[1], last_n, kept.host.shape[1]):
            return self.replay_graph(ids, starts, query_lens, kept, last_n)
        if not isinstance(starts, torch.Tensor):
            starts = self.to_device(torch.tensor(starts, dtype=torch.long))
            query_lens = self.to_device(torch.tensor(query_lens, dtype=torch.long))
        assert isinstance(query_lens, torch.Tensor)
        if kept.device is None:  # one upload per revision of the table: the draft's k forwards share one
            kept.device = self.to_device(kept.host)
        return self.run(ids, starts, query_lens, kept.device, last_n)

    def replay_graph(self, ids: torch.Tensor, starts: list[int] | torch.Tensor, query_lens: list[int] | torch.Tensor,
                     kept: KeptTable, last_n: int) -> torch.Tensor:
        """The logits of a captured step (a runner whose step has more outputs reads them here too)."""
        assert self.graphs is not None
        return self.graphs.replay(ids, starts, query_lens, kept.host, last_n, kept.revision)

    def graph_step(self, ids: torch.Tensor, starts: torch.Tensor, query_lens: torch.Tensor, tables: torch.Tensor,
                   last_n: int) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """What a fixed-width graph captures: `run` with its logits left in the head's dtype (the copy out of the
        graph widens them, so the step makes one pass over the logits instead of a widening pass and a copy), or
        a subclass's own step (its run, or outputs beyond the logits)."""
        if type(self).run is not ModelRunner.run:
            return self.run(ids, starts, query_lens, tables, last_n)
        return self._step(ids, starts, query_lens, tables, last_n, widen=False)

    @torch.inference_mode()
    def run(
        self,
        ids: torch.Tensor,
        starts: torch.Tensor,
        query_lens: torch.Tensor,
        block_tables: torch.Tensor,
        last_n: int,
    ) -> torch.Tensor:
        """The model step on device tensors only: float32 logits [B, last_n, V]."""
        return self._step(ids, starts, query_lens, block_tables, last_n, widen=True)

    @torch.inference_mode()
    def _step(self, ids: torch.Tensor, starts: torch.Tensor, query_lens: torch.Tensor, block_tables: torch.Tensor,
              last_n: int, widen: bool) -> torch.Tensor:
        meta = build_metadata(starts, query_lens, ids.shape[1], block_tables, self.cache.block_size,
                              self.config.sliding_window, self.backend)
        pick = (query_lens.unsqueeze(1) - last_n + torch.arange(last_n, device=ids.device)).clamp(min=0)
        return self.model.logits(self.model(ids, meta, self.cache.layers, pick), widen)

    def take_hidden(self, seq_ids: list[int]) -> HiddenRows | None:
        """The hidden states an EAGLE head needs for these sequences (engine/hidden_capture.py); a plain
        runner captures none."""
        return None

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        self.cache.allocator.truncate(seq_id, num_tokens)

    def free(self, seq_id: int) -> None:
        self.cache.allocator.free(seq_id)
