"""The ModelRunner of an EAGLE head: every forward takes hidden states beside the tokens.

The head's paged KV cache, block tables and attention metadata are the runner's own; only the step
differs (features in, the output hidden states out as well as the logits). Steps run eagerly: the
head is one layer, and its first step's width varies with the accepted counts.
"""

from __future__ import annotations

import torch

from minedraft.engine.attention import build_metadata
from minedraft.engine.eagle_head import EagleHead
from minedraft.engine.runner import ModelRunner


class EagleRunner(ModelRunner):
    def __init__(self, head: EagleHead, num_blocks: int, block_size: int = 16,
                 device: torch.device | str = "cpu") -> None:
        super().__init__(head, num_blocks, block_size, device, cuda_graphs=False)  # type: ignore[arg-type]
        self.head = head

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
        if kept.device is None:  # one upload per revision of the table: a proposal's k forwards share one
            kept.device = self.to_device(kept.host)
        if not isinstance(starts, torch.Tensor):
            starts = self.to_device(torch.tensor(starts, dtype=torch.long))
        if not isinstance(query_lens, torch.Tensor):
            query_lens = self.to_device(torch.tensor(query_lens, dtype=torch.long))
        meta = build_metadata(starts, query_lens, ids.shape[1], kept.device, self.cache.block_size,
                              self.config.sliding_window, self.backend)
        pick = (query_lens.unsqueeze(1) - last_n + torch.arange(last_n, device=ids.device)).clamp(min=0)
        hidden = self.head(ids, features, meta, self.cache.layers, pick)
        return self.head.logits(hidden), hidden
