"""CUDA graphs for packed (TETRIS) verifies: one graph serves every selection of a given size.

A packed verify (engine/ragged.py) runs the layers on its N valid tokens, so its shape is its token
count, not its batch. But TETRIS verifies at most C = k x batch drafts, so N <= batch x (k + 1) whatever
the per-row split: within a batch bucket only the split varies, and the split lives in data (each row's
fed and drafted counts, from which the graph itself derives the packed tokens' places and the picked
slots), not in shapes. A graph is keyed by (bucket, layout width Q, logits width, packed tokens T), with
T a grain of half a token per row apart; a step with fewer tokens (a batch below its bucket, drafts a
floor pruned) pads them with dummy tokens. The attention layout gets one row past the bucket that never
has a valid query (a sink): the dummies belong to its first slot, write no KV (its query length is 0,
as for every row past the batch), are attended by no row and their outputs are never picked. One sink
row costs one more row of attention; a never-valid slot in every row (a Q one wider) would cost the whole
batch a column.

Because the split is derived on the device, the drafts' counts never need to reach the host before the
verify: a drafter that selects on the device (engine/tetris_propose.py with a capacity) hands its counts
tensor straight to the graph, and the host only needs the step's token bound, which it decided before
drafting (engine/tetris_capacity.py).

Every packed graph writes its logits into one buffer, sized for the largest, and each replay clones its
rows out: a graph that kept its own float32 logits ([bucket, width, vocab], 0.4 GB at 64 x 12 x 128k)
would make the packed set cost more memory than all the fixed-width graphs together.

The host side is cheap: starts and fed counts (and host-known draft counts) go with numpy straight into a
pinned staging buffer (engine/staging.py) in one asynchronous copy; the block tables only when their
revision changed (engine/block_tables.py), as GraphCache does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from minedraft.engine.attention import build_metadata, packed_metadata
from minedraft.engine.cuda_graphs import BATCH_BUCKETS, MAX_GRAPH_WIDTH, GraphCache
from minedraft.engine.kv_cache import KVCache
from minedraft.engine.layers import linear
from minedraft.engine.model import CausalLM

PackedKey = tuple[int, int, int, int]  # (batch bucket, layout width Q, logits width, packed tokens)


def token_grain(bucket: int) -> int:
    """The step between the token counts of a bucket's packed graphs: half a token per row, so a verify pruned
    to any count pads at most bucket / 2 - 1 dummy tokens."""
    return max(1, bucket // 2)


@dataclass(frozen=True, slots=True)
class PackedLayout:
    """Where a packed step's inputs sit in one int64 buffer: starts [rows] | fed [rows] | drafts [rows] | block
    tables [rows, blocks]. fed[b] is how many committed tokens row b feeds before its drafts; drafts[b] how many
    drafts it verifies (what TETRIS selected). Everything else (query lengths, the packed tokens' places, the
    picked slots) is derived on the device (`indices`), so the drafts' counts may stay there."""

    batch: int  # rows whose logits come out (a graph's bucket)
    rows: int  # rows of the [rows, q] attention layout (a graph's: its bucket + the sink)
    q: int
    width: int
    tokens: int  # packed tokens, dummies included

    @property
    def heads(self) -> int:
        """Values before the block tables (what every step sends)."""
        return 3 * self.rows

    def split(self, meta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of the buffer: starts, fed, drafts, block tables ([rows, 0] without them)."""
        r = self.rows
        return meta[:r], meta[r : 2 * r], meta[2 * r : 3 * r], meta[self.heads :].view(r, -1)

    def write(self, view: np.ndarray, starts: list[int], fed: list[int], drafts: list[int] | None) -> None:
        """The heads of a batch of len(starts) rows; rows past it feed nothing. Without `drafts` their slots are
        zeroed, for the device's counts to be copied over the batch's (`PackedGraphs.replay`)."""
        batch, r = len(starts), self.rows
        assert batch <= self.batch and (batch < r or sum(fed) + sum(drafts or ()) == self.tokens)
        view[: self.heads] = 0
        view[:batch] = starts
        view[r : r + batch] = fed
        if drafts is not None:
            view[2 * r : 2 * r + batch] = drafts

    def indices(self, fed: torch.Tensor, drafts: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query lengths [rows], each row's first packed token [rows], each packed token's flat index in the [rows, q]
        layout [tokens] and the packed token each logits slot reads [batch, width], from fed and drafts [rows] on
        the device (no host sync, so a graph captures it). Row b's tokens are packed one after the other; the tokens
        past the last row's (the dummies) scatter into the sink (the last layout row, whose query length must then
        be 0); slot j of row b picks its token after its first min(j, drafts[b]) drafts, and a row that feeds
        nothing picks token 0."""
        query_lens = fed + drafts
        ends = torch.cumsum(query_lens, 0)
        offsets = ends - query_lens
        token = torch.arange(self.tokens, device=fed.device)
        row = torch.searchsorted(ends, token, right=True).clamp(max=self.rows - 1)
        sink = torch.full_like(token, (self.rows - 1) * self.q)
        rows = torch.where(token < ends[-1], row * self.q + token - offsets[row], sink)
        slot = torch.arange(self.width, device=fed.device).unsqueeze(0)
        b = self.batch
        first = offsets[:b] + fed[:b] - 1  # each row's last committed token
        picked = first.unsqueeze(1) + torch.minimum(slot, drafts[:b].unsqueeze(1))
        return query_lens, offsets, rows, torch.where(query_lens[:b].unsqueeze(1) > 0, picked, torch.zeros_like(picked))


@dataclass(frozen=True, slots=True)
class PackedStep:
    """The packed verify on device tensors only (what a packed graph captures, and the eager path runs)."""

    model: CausalLM
    cache: KVCache
    backend: str

    @torch.inference_mode()
    def __call__(self, layout: PackedLayout, ids: torch.Tensor, meta: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [batch, width, V] of ids [rows, Q] laid out by `meta` (PackedLayout's buffer); into `out` when
        given (cast there, with no float32 copy first)."""
        cache, model = self.cache, self.model
        starts, fed, drafts, tables = layout.split(meta)
        query_lens, offsets, rows, picked = layout.indices(fed, drafts)
        window = model.config.sliding_window
        if self.backend == "triton":  # the attention reads the packed tokens in place
            metadata = packed_metadata(starts, query_lens, offsets, rows, ids.shape[1], tables, cache.block_size,
                                       window)
        else:
            metadata = build_metadata(starts, query_lens, ids.shape[1], tables, cache.block_size, window,
                                      self.backend)
        hidden = model(ids, metadata, cache.layers, packed=(rows, picked))
        if out is None:
            return model.logits(hidden)
        assert model.head_weight is not None, "fuse_projections() first"
        return out.copy_(linear(hidden, model.head_weight))


@dataclass(slots=True)
class PackedCapture:
    replay: Callable[[], object]  # the graph's replay (or, staged without a graph, the step itself)
    layout: PackedLayout
    ids: torch.Tensor  # [bucket + 1, Q]
    meta: torch.Tensor  # PackedLayout's buffer, block tables [bucket + 1, max_blocks] included
    logits: torch.Tensor  # [bucket, width, V], a view of the shared output
    table_revision: int | None = None  # the block tables' revision `meta` holds (None: unknown)


@dataclass(slots=True)
class PackedGraphs:
    """Packed verifies captured beside a runner's GraphCache: its memory pool, staging ring, capture time,
    and closed set (once its capture_ahead ran, only shapes captured by then replay)."""

    cache: GraphCache
    step: PackedStep
    vocab_size: int
    steps: dict[PackedKey, PackedCapture] = field(default_factory=dict)
    replays: int = 0
    out: torch.Tensor | None = None  # the logits buffer every packed graph writes (they replay one at a time)

    def capture_ahead(self, keys: Iterable[PackedKey]) -> int:
        """Capture these now (the set closes with the GraphCache's); returns how many were new."""
        new = [key for key in dict.fromkeys(keys) if key not in self.steps]
        self.output(max((key[0] * key[2] for key in new), default=0))  # one buffer for all of them
        for key in new:
            self._capture(key)
        return len(new)

    def find(self, batch: int, q: int, width: int, tokens: int, table_width: int) -> PackedKey | None:
        """The graph for a packed step of up to `tokens` over `batch` rows of up to q tokens (the fewest tokens
        that hold them); None: run it eagerly (no bucket, too wide, or outside the closed set)."""
        bucket = GraphCache.bucket(batch)
        if bucket is None or q > MAX_GRAPH_WIDTH or table_width > self.cache.max_blocks_per_seq:
            return None
        grain = token_grain(bucket)
        wanted = (bucket, q, width, -(-tokens // grain) * grain)
        if not self.cache.closed and wanted not in self.steps:
            return wanted  # a pruned step runs its GEMMs on the tokens it verifies
        held = [key for key in self.steps if key[:3] == (bucket, q, width) and key[3] >= tokens]
        if held:
            return min(held, key=lambda key: key[3])
        if self.cache.closed:
            self.cache.say_eager((bucket, q, width, -1), f"packed verify of up to {bucket} sequences x {q} "
                                                         f"tokens ({tokens} in all, logits for {width})")
            return None
        return wanted

    def replay(self, key: PackedKey, ids: torch.Tensor, starts: list[int], fed: list[int],
               drafts: list[int] | torch.Tensor, tables: torch.Tensor, table_revision: int | None) -> torch.Tensor:
        """Logits [batch, width, V] of the step `find` gave this key for (ids [batch, Q] on the device, tables
        [batch, w] on the host, each row's draft count on the host or the device); captured first if the set is
        still open."""
        step = self.steps.get(key) or self._capture(key)
        layout, batch, w = step.layout, ids.shape[0], tables.shape[1]
        send_table = table_revision is None or table_revision != step.table_revision
        buf, view = self.cache.staging.take(layout.heads + (batch * w if send_table else 0))
        on_device = isinstance(drafts, torch.Tensor)
        layout.write(view, starts, fed, None if on_device else drafts)  # type: ignore[arg-type]
        step.meta[: layout.heads].copy_(buf[: layout.heads], non_blocking=True)
        parts = layout.split(step.meta)
        if on_device:  # behind the heads' copy on the same stream, over its zeros
            parts[2][:batch].copy_(drafts)
        if send_table:
            view[layout.heads : layout.heads + batch * w] = tables.numpy().reshape(-1)
            sent = buf[layout.heads : layout.heads + batch * w].view(batch, w)
            parts[3][:batch, :w].copy_(sent, non_blocking=True)
            step.table_revision = table_revision
        self.cache.staging.sent()
        step.ids[:batch].copy_(ids)
        step.replay()
        self.replays += 1
        return step.logits[:batch].clone()

    def output(self, numel: int) -> torch.Tensor:
        """The shared logits buffer, grown to hold `numel` rows of the vocabulary (graphs captured before keep
        the old one)."""
        if self.out is None or self.out.numel() < numel * self.vocab_size:
            with torch.inference_mode(False):  # a plain tensor, whatever mode the first capture runs in
                self.out = torch.empty(numel * self.vocab_size, dtype=torch.float32, device=self.cache.device)
        return self.out

    def stage(self, key: PackedKey) -> PackedCapture:
        """Static buffers for a key and the step over them (what `_capture` records as a graph)."""
        bucket, q, width, tokens = key
        layout = PackedLayout(bucket, bucket + 1, q, width, tokens)
        device = self.cache.device
        with torch.inference_mode(False):  # plain tensors: a replay may come from outside inference mode
            ids = torch.zeros((layout.rows, q), dtype=torch.long, device=device)
            meta = torch.zeros(layout.heads + layout.rows * self.cache.max_blocks_per_seq, dtype=torch.long,
                               device=device)
        logits = self.output(bucket * width)[: bucket * width * self.vocab_size].view(bucket, width, -1)
        return PackedCapture(lambda: self.step(layout, ids, meta, logits), layout, ids, meta, logits)

    def _capture(self, key: PackedKey) -> PackedCapture:
        started = time.perf_counter()
        step = self.stage(key)
        graph, _ = self.cache.capture(step.replay)
        step.replay = graph.replay
        self.steps[key] = step
        self.cache.capture_ms += (time.perf_counter() - started) * 1000.0
        return step


def selection_keys(top: int, max_k: int, extra: int, min_batch: int) -> list[PackedKey]:
    """The packed verifies TETRIS steps take with `extra` drafts beyond k = 1..max_k: batches of at least
    `min_batch` (buckets from its bucket up to `top`) verifying up to k x batch drafts, so up to batch x (k + 1)
    tokens, in a layout k + extra + 1 wide. A floor on the estimated acceptance (engine/tetris.py) verifies
    fewer, so each k also gets graphs of fewer tokens, a grain (half a token per row) apart, down to half of
    batch x (k + 1) (a step pruned deeper pads up to the smallest of them)."""
    first = GraphCache.bucket(min_batch)
    if first is None or extra < 0:
        return []
    return [(b, k + extra + 1, k + extra + 1, t) for b in BATCH_BUCKETS if first <= b <= top
            for k in range(1, max_k + 1) if k + extra + 1 <= MAX_GRAPH_WIDTH
            for t in range(b * (k + 1), b * max(1, (k + 1) // 2) - 1, -token_grain(b))]
