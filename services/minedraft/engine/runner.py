"""Runs one model over a batch of sequences that each bring some new tokens.

The runner owns the model and its paged KV cache. A forward call says, per sequence,
which tokens to feed and at which position the first of them sits; the runner grows
block tables, builds the attention metadata, and returns logits for the last positions
asked for. Prefill chunks, single-token decodes and k+1-token verify windows share
this one path.
"""

from __future__ import annotations

import torch

from minedraft.engine.attention import build_metadata
from minedraft.engine.kv_cache import KVCache
from minedraft.engine.model import CausalLM


class ModelRunner:
    """A model plus its KV cache on one device."""

    def __init__(
        self,
        model: CausalLM,
        num_blocks: int,
        block_size: int = 16,
        device: torch.device | str = "cpu",
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.config = model.config
        self.device = torch.device(device)
        dtype = kv_dtype or next(model.parameters()).dtype
        self.cache = KVCache(model.config, num_blocks, block_size, self.device, dtype)

    @property
    def allocator(self):
        return self.cache.allocator

    @torch.inference_mode()
    def forward(
        self, seq_ids: list[int], tokens: list[list[int]], starts: list[int], last_n: int
    ) -> torch.Tensor:
        """Feed tokens[b] at positions starts[b].. and return logits [B, last_n, V].

        Row b's logits are those of its last `last_n` fed tokens; rows that fed fewer
        repeat their first position (callers never read those).
        """
        for seq_id, toks, start in zip(seq_ids, tokens, starts, strict=True):
            self.cache.allocator.ensure(seq_id, start + len(toks))
        lens = [len(t) for t in tokens]
        width = max(lens)
        ids = torch.zeros((len(tokens), width), dtype=torch.long)
        for row, toks in enumerate(tokens):
            ids[row, : len(toks)] = torch.tensor(toks, dtype=torch.long)
        ids = ids.to(self.device)
        query_lens = torch.tensor(lens, dtype=torch.long, device=self.device)
        start_t = torch.tensor(starts, dtype=torch.long, device=self.device)
        offsets = torch.arange(width, device=self.device).unsqueeze(0)
        positions = torch.where(offsets < query_lens.unsqueeze(1), start_t.unsqueeze(1) + offsets, 0)
        meta = build_metadata(
            positions,
            query_lens,
            self.cache.block_table_tensor(seq_ids, self.device),
            self.cache.block_size,
            self.config.sliding_window,
        )
        hidden = self.model(ids, meta, self.cache.layers)
        pick = (query_lens.unsqueeze(1) - last_n + torch.arange(last_n, device=self.device)).clamp(min=0)
        chosen = hidden.gather(1, pick.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        return self.model.logits(chosen)

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        self.cache.allocator.truncate(seq_id, num_tokens)

    def free(self, seq_id: int) -> None:
        self.cache.allocator.free(seq_id)
