"""Paged KV cache: fixed-size blocks, a free list, and per-sequence block tables.

Speculative decoding writes KV for draft positions that may be rejected; rolling back is
just shrinking the sequence's length (`truncate`), which hands back whole blocks that
are no longer needed. Stale slots inside a kept block are masked out by position and
overwritten by the next step.

Blocks are reference counted so that sequences with a common prefix (the n choices of one
request) can hold the same full blocks (`share`); a block goes back to the free list when
its last holder lets it go. Sharers only ever write past the shared blocks.

Prefix caching: a full block whose tokens are verified may be published under its content key
(core/prefix_hash.py); a later sequence with the same prefix attaches it instead of computing it.
A published block keeps its key after its last holder lets go, on the free list in LRU order,
and loses it only when it is handed out again: free blocks without a key go first, then cached
ones least recently freed first. A sequence's blocks are freed tail first, so its private tail
is evicted before the prefix others may share.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from minedraft.core.errors import OutOfBlocksError
from minedraft.engine.config import ModelConfig


class BlockAllocator:
    """Hands out KV blocks to sequences and takes them back (a shared block when its last holder lets go)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # head: handed out next
        self._tables: dict[int, list[int]] = {}
        self._refs = [0] * num_blocks  # holders per block; 0: on the free list
        self._key: list[bytes | None] = [None] * num_blocks  # the content key a published block is cached under
        self._cached: dict[bytes, int] = {}  # content key -> block
        self.evictions = 0  # cached blocks handed out for other content
        # Table versions, so a block-table tensor can be kept between forwards (engine/block_tables.py): `version`
        # counts table changes; `_changed[seq]` is the version of that sequence's last change (none: changed).
        self.version = 0
        self._changed: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks no sequence holds, cached ones included (they are evicted when needed)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks holding a published prefix, held or free."""
        return len(self._cached)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, seq_id: int) -> list[int]:
        return self._tables.get(seq_id, [])

    def changed_since(self, seq_id: int, version: int) -> bool:
        """Whether the sequence's table may differ from what it was at `version` (unknown sequences may)."""
        return self._changed.get(seq_id, version + 1) > version

    def _touch(self, seq_id: int) -> None:
        self.version += 1
        self._changed[seq_id] = self.version

    def refs(self, block: int) -> int:
        """How many sequences hold `block` (0: free)."""
        return self._refs[block]

    def extra_blocks_needed(self, seq_id: int, num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - len(self.table(seq_id)))

    def ensure(self, seq_id: int, num_tokens: int) -> None:
        """Grow a sequence's table so it can hold `num_tokens` positions (new blocks are its own)."""
        need = self.extra_blocks_needed(seq_id, num_tokens)
        if need > len(self._free):
            raise OutOfBlocksError(
                f"sequence {seq_id} needs {need} more KV blocks, only {len(self._free)} free"
            )
        if need == 0 and seq_id in self._tables:
            return
        self._touch(seq_id)
        table = self._tables.setdefault(seq_id, [])
        for _ in range(need):
            block, _ = self._free.popitem(last=False)
            key = self._key[block]
            if key is not None:
                del self._cached[key]
                self._key[block] = None
                self.evictions += 1
            self._refs[block] = 1
            table.append(block)

    def lookup(self, keys: list[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of `keys` (stops at the first miss)."""
        out: list[int] = []
        for key in keys:
            block = self._cached.get(key)
            if block is None:
                break
            out.append(block)
        return out

    def attach(self, seq_id: int, blocks: list[int]) -> None:
        """Give a sequence that holds no block yet the cached `blocks` as its first ones."""
        if self._tables.get(seq_id):
            raise ValueError(f"sequence {seq_id} already holds KV blocks")
        for block in blocks:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1
        self._tables[seq_id] = list(blocks)
        self._touch(seq_id)

    def publish(self, seq_id: int, keys: list[bytes], start: int) -> None:
        """Cache the sequence's blocks start..len(keys)-1 under `keys` (their tokens are verified). A block
        already cached keeps its key; one whose content another block already caches stays private."""
        table = self._tables.get(seq_id, [])
        for i in range(start, min(len(keys), len(table))):
            block, key = table[i], keys[i]
            if self._key[block] is None and key not in self._cached:
                self._key[block] = key
                self._cached[key] = block

    def share(self, parent: int, child: int, num_tokens: int) -> int:
        """Give `child` (holding no block yet) the parent's full blocks among positions [0, num_tokens - 1):
        the child computes at least its last token itself, whose logits it needs. Returns the positions
        shared (a multiple of the block size)."""
        if self._tables.get(child):
            raise ValueError(f"sequence {child} already holds KV blocks")
        count = max(0, num_tokens - 1) // self.block_size
        source = self._tables.get(parent, [])
        if count > len(source):
            raise ValueError(f"sequence {parent} holds {len(source)} blocks, {count} asked to share")
        shared = source[:count]
        for block in shared:
            self._refs[block] += 1
        self._tables[child] = list(shared)
        self._touch(child)
        return count * self.block_size

    def _release(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free[block] = None  # a cached block joins the tail: evicted last
            if self._key[block] is None:
                self._free.move_to_end(block, last=False)  # nothing to keep: handed out first

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Keep only the blocks that positions [0, num_tokens) occupy."""
        table = self._tables.get(seq_id)
        if table is None:
            return
        keep = self.blocks_for(num_tokens)
        if len(table) > keep:
            self._touch(seq_id)
        while len(table) > keep:
            self._release(table.pop())

    def free(self, seq_id: int) -> None:
        self.version += 1
        self._changed.pop(seq_id, None)  # unknown from now on: changed for every version
        for block in reversed(self._tables.pop(seq_id, [])):
            self._release(block)

    def sequences(self) -> list[int]:
        return list(self._tables)


class KVCache:
    """Per-layer key and value block pools: [num_blocks, block_size, kv_heads, head_dim]."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_blocks: int,
        block_size: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [
            (torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
            for _ in range(cfg.num_layers)
        ]

    @property
    def block_size(self) -> int:
        return self.allocator.block_size

    def block_table_tensor(self, seq_ids: list[int], device: torch.device | str, multiple: int = 1,
                           limit: int = 0) -> torch.Tensor:
        """Padded [B, max_blocks] table of physical block ids for a batch; with `multiple`, the width is rounded
        up to one (within `limit`), so a growing context keeps one shape class (Triton specializes an integer
        argument on its divisibility by 16 and compiles a new kernel when that changes: about a second)."""
        tables = [self.allocator.table(s) for s in seq_ids]
        width = max((len(t) for t in tables), default=1) or 1
        if multiple > 1:
            width = max(width, min(-(-width // multiple) * multiple, limit or width))
        rows = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(rows, dtype=torch.long, device=device)
