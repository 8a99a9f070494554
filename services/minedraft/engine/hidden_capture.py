"""The verifier's side of EAGLE: keep the hidden states an EAGLE head drafts from, until they ship.

Every forward of the target (prefill chunks, a prompt, a verify window, an AR step) computes the
feature of each fed position: the last hidden state (what lm_head reads) for EAGLE-1/2, or for EAGLE-3
the residual-stream inputs of its three tap layers, concatenated. They wait per sequence in an outbox
and leave with the sequence's next verdict (`take_hidden`), so prefill chunks travel with the first
verdict and nothing is sent twice. A write at position p supersedes what the outbox holds from p on,
as a KV write does (a rejected draft's position is computed again by the next step).

Fixed-width steps (verify windows, AR steps) replay CUDA graphs as the plain runner's do: the graph's
step returns the features [bucket, width, F] beside the logits, into a buffer of its own, and the
runner records the real rows' (a copy: the next replay overwrites the buffer) after the replay, so the
host bookkeeping stays out of the graph. Other shapes (prefills) run eagerly and record the same way.
"""

from __future__ import annotations

import torch

from minedraft.engine.attention import build_metadata, take_rows
from minedraft.engine.block_tables import KeptTable
from minedraft.engine.hidden_rows import HiddenRows
from minedraft.engine.model import CausalLM
from minedraft.engine.runner import ModelRunner

MAX_ROWS = 8192  # per sequence; beyond it the oldest go (the draft zero-fills them: still exact)


class CapturingRunner(ModelRunner):
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int = 16, device: torch.device | str = "cpu",
                 taps: tuple[int, ...] = (), cuda_graphs: bool = True, keeps: bool = True) -> None:
        super().__init__(model, num_blocks, block_size, device, cuda_graphs=cuda_graphs)
        self.taps = taps  # () = the last hidden state (EAGLE-1/2)
        self.keeps = keeps  # False: a tensor-parallel follower's runner, whose forwards must only match rank 0's
        self.outbox: dict[int, list[tuple[int, torch.Tensor]]] = {}
        self._fed: tuple[list[int], list[int], list[int]] = ([], [], [])

    def forward_on_device(self, seq_ids: list[int], ids: torch.Tensor, starts: list[int] | torch.Tensor,
                          query_lens: list[int] | torch.Tensor, reserve: list[int], last_n: int) -> torch.Tensor:
        host_starts = starts.tolist() if isinstance(starts, torch.Tensor) else list(starts)
        host_lens = query_lens.tolist() if isinstance(query_lens, torch.Tensor) else list(query_lens)
        self._fed = (seq_ids, host_starts, host_lens)
        return super().forward_on_device(seq_ids, ids, starts, query_lens, reserve, last_n)

    def replay_graph(self, ids: torch.Tensor, starts: list[int] | torch.Tensor, query_lens: list[int] | torch.Tensor,
                     kept: KeptTable, last_n: int) -> torch.Tensor:
        """Replay the step's graph, then record its real rows' features (copied out of the graph's buffer)."""
        assert self.graphs is not None
        step = self.graphs.launch(ids, starts, query_lens, kept.host, last_n, kept.revision)
        batch = ids.shape[0]
        self._record(step.extras[0][:batch].clone())
        return step.logits[:batch].clone()

    def graph_step(self, ids: torch.Tensor, starts: torch.Tensor, query_lens: torch.Tensor, tables: torch.Tensor,
                   last_n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.step_with_features(ids, starts, query_lens, tables, last_n)

    @torch.inference_mode()
    def run(self, ids: torch.Tensor, starts: torch.Tensor, query_lens: torch.Tensor, block_tables: torch.Tensor,
            last_n: int) -> torch.Tensor:
        logits, features = self.step_with_features(ids, starts, query_lens, block_tables, last_n)
        self._record(features)
        return logits

    @torch.inference_mode()
    def step_with_features(self, ids: torch.Tensor, starts: torch.Tensor, query_lens: torch.Tensor,
                           block_tables: torch.Tensor, last_n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The step on device tensors only (what a graph captures): logits [B, last_n, V] and every fed
        position's features [B, Q, F]."""
        meta = build_metadata(starts, query_lens, ids.shape[1], block_tables, self.cache.block_size,
                              self.config.sliding_window, self.backend)
        layers = tuple(sorted(set(self.taps)))
        aux: list[torch.Tensor] | None = [] if self.taps else None
        hidden = self.model(ids, meta, self.cache.layers, None, layers, aux)
        features = torch.cat([aux[layers.index(i)] for i in self.taps], -1) if aux else hidden
        pick = (query_lens.unsqueeze(1) - last_n + torch.arange(last_n, device=ids.device)).clamp(min=0)
        return self.model.logits(take_rows(hidden, pick)), features

    def _record(self, features: torch.Tensor) -> None:
        if not self.keeps:
            return
        seq_ids, starts, lens = self._fed
        for b, (seq_id, start, n) in enumerate(zip(seq_ids, starts, lens, strict=True)):
            kept = [(s, t[: max(0, start - s)]) for s, t in self.outbox.get(seq_id, []) if s < start]
            kept.append((start, features[b, :n]))
            total = sum(t.shape[0] for _, t in kept)
            while total > MAX_ROWS:
                s, t = kept[0]
                drop = min(t.shape[0], total - MAX_ROWS)
                kept[0] = (s + drop, t[drop:])
                total -= drop
                if not kept[0][1].shape[0]:
                    kept.pop(0)
            self.outbox[seq_id] = kept

    def take_hidden(self, seq_ids: list[int]) -> HiddenRows | None:
        """The states waiting for these sequences, as one run per row (a gap the prefix cache skipped is
        left to the draft), and an empty outbox for them."""
        starts, counts, parts = [], [], []
        for seq_id in seq_ids:
            segments = self.outbox.pop(seq_id, [])
            segments = [(s, t) for s, t in segments if t.shape[0]]
            first = segments[-1][0] if segments else 0
            run = [segments[-1][1]] if segments else []
            for s, t in reversed(segments[:-1]):  # contiguous runs only: the last one that reaches the end
                if s + t.shape[0] != first:
                    break
                first, run = s, [t, *run]
            starts.append(first)
            counts.append(sum(t.shape[0] for t in run))
            parts.extend(run)
        width = self._width()
        rows = torch.cat(parts) if parts else torch.zeros((0, width), dtype=self.model.lm_head.weight.dtype,
                                                                 device=self.device)
        return HiddenRows(starts, counts, rows)

    def _width(self) -> int:
        return self.config.hidden_size * max(1, len(self.taps))

    def free(self, seq_id: int) -> None:
        self.outbox.pop(seq_id, None)
        super().free(seq_id)
