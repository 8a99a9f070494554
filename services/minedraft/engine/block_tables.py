"""A batch's block-table tensor kept between forwards and brought up to date row by row.

Building the padded [batch, blocks] table from the allocator's lists is Python work over every row and
block, and a step used to do it for every forward: the draft's k forwards rebuilt an unchanged table
k times, and a decode step rebuilt 64 rows of which one or two had grown. The allocator counts table
changes (`BlockAllocator.version`, `changed_since`), so a kept table is reused as it is when nothing
changed since it was made, and otherwise only the rows of sequences whose tables changed are rewritten.
The tensor always equals what `KVCache.block_table_tensor` would build for the same batch (its width
rule included), which the tests check after every kind of change.

Each kept table also carries a `revision`, new whenever its contents change, so a consumer that copied
it somewhere (a CUDA graph's input buffer, a device tensor) can tell that its copy is still current.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

import torch

from minedraft.engine.kv_cache import BlockAllocator

KEPT_BATCHES = 4  # PSD alternates two batches per worker; a little room for prefill chunks beside them


@dataclass(slots=True)
class KeptTable:
    """One batch's table: `host` [batch, width] int64 on the CPU, valid until the next `BlockTables.get`."""

    host: torch.Tensor
    lengths: list[int]  # blocks per row
    version: int  # the allocator's version the table was last brought up to
    revision: int  # new whenever `host` changes
    device: torch.Tensor | None = None  # a copy on the model's device of this revision, once one was made


def table_width(longest: int, multiple: int, limit: int) -> int:
    """KVCache.block_table_tensor's width rule: the longest row, rounded up to `multiple` within `limit`."""
    width = longest or 1
    if multiple > 1:
        width = max(width, min(-(-width // multiple) * multiple, limit or width))
    return width


class BlockTables:
    """Kept block tables of the last few batches one runner fed."""

    def __init__(self, allocator: BlockAllocator, multiple: int = 1, limit: int = 0) -> None:
        self.allocator = allocator
        self.multiple = multiple
        self.limit = limit
        self._kept: OrderedDict[tuple[int, ...], KeptTable] = OrderedDict()
        self._revisions = itertools.count()
        self.rebuilt = 0  # whole tables built (a new batch, or a width change)
        self.rows_written = 0  # rows rewritten in kept tables

    def get(self, seq_ids: list[int]) -> KeptTable:
        key = tuple(seq_ids)
        alloc = self.allocator
        kept = self._kept.get(key)
        if kept is None:
            return self._build(key)
        self._kept.move_to_end(key)
        if kept.version == alloc.version:
            return kept
        changed = [b for b, s in enumerate(seq_ids) if alloc.changed_since(s, kept.version)]
        if changed:
            tables = [alloc.table(seq_ids[b]) for b in changed]
            for b, table in zip(changed, tables, strict=True):
                kept.lengths[b] = len(table)
            width = kept.host.shape[1]
            if table_width(max(kept.lengths, default=0), self.multiple, self.limit) != width:
                return self._build(key)
            with torch.inference_mode(False):  # kept tables are plain tensors, whatever mode a caller runs in
                kept.host[torch.tensor(changed)] = torch.tensor([t + [0] * (width - len(t)) for t in tables],
                                                                dtype=torch.long)
            kept.revision, kept.device = next(self._revisions), None
            self.rows_written += len(changed)
        kept.version = alloc.version
        return kept

    def _build(self, key: tuple[int, ...]) -> KeptTable:
        alloc = self.allocator
        tables = [alloc.table(s) for s in key]
        lengths = [len(t) for t in tables]
        width = table_width(max(lengths, default=0), self.multiple, self.limit)
        with torch.inference_mode(False):
            host = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long).view(len(key), width)
        kept = KeptTable(host, lengths, alloc.version, next(self._revisions))
        self._kept[key] = kept
        self._kept.move_to_end(key)
        while len(self._kept) > KEPT_BATCHES:
            self._kept.popitem(last=False)
        self.rebuilt += 1
        return kept
