"""The ModelRunner of an EAGLE head: every forward takes hidden states beside the tokens.

The head's paged KV cache, block tables and attention metadata are the runner's own; only the step
differs (features in, the output hidden states out as well as the logits). A proposal's first forward
has a width that varies with the accepted counts and runs eagerly; the k-1 feedback forwards that
follow it (one token per row, the head's own output [B, 1, h] as its state) replay a CUDA graph per
batch bucket. Their features go through one static buffer that every head graph reads its rows of,
and the graph's step returns the output hidden states beside the logits (engine/cuda_graphs.py).
"""

from __future__ import annotations

import torch

from minedraft.engine.attention import build_metadata
from minedraft.engine.cuda_graphs import BATCH_BUCKETS, GraphCache
from minedraft.engine.eagle_head import EagleHead
from minedraft.engine.runner import ModelRunner


class EagleRunner(ModelRunner):
    def __init__(self, head: EagleHead, num_blocks: int, block_size: int = 16,
                 device: torch.device | str = "cpu", cuda_graphs: bool = True) -> None:
        super().__init__(head, num_blocks, block_size, device, cuda_graphs=cuda_graphs)  # type: ignore[arg-type]
        self.head = head
        self.fed_back: torch.Tensor | None = None  # the graphs' features [top bucket, 1, h], once they exist
        if self.graphs is not None:
            self.stage_features()

    def stage_features(self) -> torch.Tensor:
        """The static features buffer the feedback graphs read (a test staging graphs on the CPU calls it)."""
        if self.fed_back is None:
            weight = self.head.embed_tokens.weight
            with torch.inference_mode(False):  # a plain tensor: filled from outside inference mode too
                self.fed_back = torch.zeros((BATCH_BUCKETS[-1], 1, self.config.hidden_size), dtype=weight.dtype,
                                            device=self.device)
        return self.fed_back

    def capture_ahead(self, max_batch: int, k: int, scoring: bool = False,
                      selection: tuple[int, int] | None = None) -> int:
        """The feedback forwards' graphs ([B, 1] ids and states, logits at that one position) of every batch
        bucket up to `max_batch`; the first forward of a proposal stays eager. Returns how many were new."""
        if self.graphs is None or max_batch <= 0:
            return 0
        top = GraphCache.bucket(max_batch) or BATCH_BUCKETS[-1]
        return self.graphs.capture_ahead((b, 1, 1) for b in BATCH_BUCKETS if b <= top)

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
        batch, width = ids.shape
        one_state = width == 1 and last_n == 1 and features.shape[-1] == self.config.hidden_size
        if (one_state and self.graphs is not None and self.fed_back is not None
                and self.graphs.can_replay(batch, 1, 1, kept.host.shape[1])):
            self.fed_back[:batch].copy_(features)
            step = self.graphs.launch(ids, starts, query_lens, kept.host, 1, kept.revision)
            return step.logits[:batch].clone(), step.extras[0][:batch].clone()
        if kept.device is None:  # one upload per revision of the table: a proposal's k forwards share one
            kept.device = self.to_device(kept.host)
        if not isinstance(starts, torch.Tensor):
            starts = self.to_device(torch.tensor(starts, dtype=torch.long))
        if not isinstance(query_lens, torch.Tensor):
            query_lens = self.to_device(torch.tensor(query_lens, dtype=torch.long))
        return self.head_step(ids, features, starts, query_lens, kept.device, last_n)

    def graph_step(self, ids: torch.Tensor, starts: torch.Tensor, query_lens: torch.Tensor, tables: torch.Tensor,
                   last_n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A feedback graph's step: the rows of the static features buffer that its bucket holds."""
        return self.head_step(ids, self.stage_features()[: ids.shape[0]], starts, query_lens, tables, last_n)

    @torch.inference_mode()
    def head_step(self, ids: torch.Tensor, features: torch.Tensor, starts: torch.Tensor, query_lens: torch.Tensor,
                  tables: torch.Tensor, last_n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's step on device tensors only: logits [B, last_n, V] and output hidden [B, last_n, h]."""
        meta = build_metadata(starts, query_lens, ids.shape[1], tables, self.cache.block_size,
                              self.config.sliding_window, self.backend)
        pick = (query_lens.unsqueeze(1) - last_n + torch.arange(last_n, device=ids.device)).clamp(min=0)
        hidden = self.head(ids, features, meta, self.cache.layers, pick)
        return self.head.logits(hidden), hidden
