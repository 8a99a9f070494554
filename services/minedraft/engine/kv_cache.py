"""Paged KV cache: fixed-size blocks, a free list, and per-sequence block tables.

Speculative decoding writes KV for draft positions that may be rejected; rolling back is
just shrinking the sequence's length (`truncate`), which hands back whole blocks that
are no longer needed. Stale slots inside a kept block are masked out by position and
overwritten by the next step.

Blocks are reference counted so that sequences with a common prefix (the n choices of one
request) can hold the same full blocks (`share`); a block goes back to the free list when
its last holder lets it go. Sharers only ever write past the shared blocks.
"""

from __future__ import annotations

from collections import deque

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
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[int, list[int]] = {}
        self._refs = [0] * num_blocks  # holders per block; 0: on the free list

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, seq_id: int) -> list[int]:
        return self._tables.get(seq_id, [])

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
        table = self._tables.setdefault(seq_id, [])
        for _ in range(need):
            block = self._free.popleft()
            self._refs[block] = 1
            table.append(block)

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
        return count * self.block_size

    def _release(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free.append(block)

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Keep only the blocks that positions [0, num_tokens) occupy."""
        table = self._tables.get(seq_id)
        if table is None:
            return
        keep = self.blocks_for(num_tokens)
        while len(table) > keep:
            self._release(table.pop())

    def free(self, seq_id: int) -> None:
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

    def block_table_tensor(self, seq_ids: list[int], device: torch.device | str) -> torch.Tensor:
        """Padded [B, max_blocks] table of physical block ids for a batch."""
        tables = [self.allocator.table(s) for s in seq_ids]
        width = max((len(t) for t in tables), default=1) or 1
        rows = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(rows, dtype=torch.long, device=device)
