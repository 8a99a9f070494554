"""Verify windows of per-row lengths that cost what they verify.

With TETRIS (engine/tetris.py) row b of a verify checks 1 + lengths[b] tokens, not k + 1. In the
padded [B, Q] layout the projections and MLPs would still run on B x Q rows, so verifying fewer
tokens would save nothing (and drafting k + extra would make it dearer). Here every linear layer
and MLP runs on the valid tokens alone, packed [1, N, hidden]. On CUDA the attention kernel reads them in
place too, each row's queries from its offset (engine/attention.py's `packed_metadata`); the torch path
scatters each layer's qkv projection into the [B, Q] layout and gathers its output back (model.py's
`rows`), so its attention and metadata are the padded ones.

On CUDA these steps replay graphs (engine/ragged_graphs.py): TETRIS verifies at most k x batch drafts,
so a batch's packed token count is at most batch x (k + 1) whatever the split, and one graph per (batch
bucket, width, packed tokens) serves every selection, a smaller step padded with dummy tokens that write
nothing. The per-row draft counts may stay on the device (a selection made there): the graph derives the
layout from them, and the step's token bound (the selection's capacity, decided before drafting) picks the
graph. A verifier captures them at start-up beside its fixed-width graphs (`ModelRunner.capture_ahead`
with the policy's default tetris_extra and tetris_min_batch); once that set is closed, a verify it
does not hold (a tetris_extra changed beyond it, a batch below the captured buckets, a step still
feeding part of a prompt) runs eagerly, logged once per shape, and is never captured while serving.
Both paths take the runner's kept block tables.

The logits come back left-aligned [B, k+1, V]: slot j of row b is the distribution after its first
j drafts, for j <= lengths[b] (later slots repeat slot lengths[b]), as the rejection rule reads them.
A runner that overrides its step (hidden-state capture for an EAGLE head) keeps its own padded path
with per-row query lengths, and its logits are aligned the same way.
"""

from __future__ import annotations

import numpy as np
import torch

from minedraft.engine.ragged_graphs import PackedLayout, PackedStep
from minedraft.engine.runner import ModelRunner
from minedraft.engine.sequence import SeqState


def verify_logits(runner: ModelRunner, states: list[SeqState], drafts: torch.Tensor,
                  lengths: list[int] | torch.Tensor, whole: bool = False, capacity: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Target logits [B, k+1, V], left-aligned, for each row's uncached tokens and first lengths[b] drafts
    (drafts [B, k] on the device, -1 past a row's length); with `whole` also every fed position's logits
    ([B, W, V], rows right-aligned, as the verifier's prompt logprobs read them). `lengths` may stay on the
    device (a selection made there) when `capacity` bounds their sum; a step that is not a steady packed one
    then reads them back first."""
    k = drafts.shape[1]
    seq_ids = [st.seq_id for st in states]
    starts = [st.cached for st in states]
    steady = all(st.length - st.cached == 1 for st in states)
    if isinstance(lengths, torch.Tensor) and (whole or not steady or not runner.packs_verifies or capacity is None):
        lengths = lengths.tolist()
    if steady:  # the drafts stay on the device
        last = runner.to_device(torch.tensor([st.tokens[-1] for st in states], dtype=torch.long))
        ids = torch.cat((last.unsqueeze(1), drafts.clamp(min=0)), dim=1)
        fed = [1] * len(states)
    else:
        assert isinstance(lengths, list)
        host = drafts.tolist()
        feed = [st.uncached() + row[:n] for st, row, n in zip(states, host, lengths, strict=True)]
        fed = [len(st.uncached()) for st in states]
        width = max(len(f) for f in feed)
        ids = runner.to_device(torch.tensor([f + [0] * (width - len(f)) for f in feed], dtype=torch.long))
    if not whole and runner.packs_verifies:
        drafted = capacity if isinstance(lengths, torch.Tensor) else sum(lengths)
        assert drafted is not None
        return packed_forward(runner, seq_ids, ids, starts, fed, lengths, k + 1, sum(fed) + drafted), None
    assert isinstance(lengths, list)
    query_lens = [f + n for f, n in zip(fed, lengths, strict=True)]
    full = runner.forward_ids(seq_ids, ids, starts, query_lens, last_n=max(query_lens))
    width = full.shape[1]
    slot = torch.arange(k + 1).unsqueeze(0)
    n = torch.tensor(lengths).unsqueeze(1)
    index = runner.to_device(width - 1 - n + torch.minimum(slot, n))
    window = full.gather(1, index.unsqueeze(-1).expand(-1, -1, full.shape[-1]))
    return window, full if whole else None


@torch.inference_mode()
def packed_forward(runner: ModelRunner, seq_ids: list[int], ids: torch.Tensor, starts: list[int], fed: list[int],
                   drafts: list[int] | torch.Tensor, width: int, tokens: int) -> torch.Tensor:
    """Logits [B, width, V] of each row's last 1 + drafts[b] fed tokens (left-aligned; later slots repeat the
    row's last) after its fed[b] committed ones, computed with the layers on the packed valid tokens, at most
    `tokens` of them (exactly, with the counts on the host): a graph's replay when the runner holds one for the
    step, else eagerly. Each row's KV is reserved for its whole window ids [B, Q] when its count is on the
    device."""
    alloc = runner.allocator
    on_device = isinstance(drafts, torch.Tensor)
    reach = [ids.shape[1]] * len(seq_ids) if on_device else [f + n for f, n in zip(fed, drafts, strict=True)]
    for seq_id, start, n in zip(seq_ids, starts, reach, strict=True):
        alloc.ensure(seq_id, start + n)
    kept = runner.tables.get(seq_ids)
    batch, graphs = len(seq_ids), runner.packed_graphs
    key = graphs.find(batch, ids.shape[1], width, tokens, kept.host.shape[1]) if graphs is not None else None
    if graphs is not None and key is not None:
        return graphs.replay(key, ids, starts, fed, drafts, kept.host, kept.revision)
    # eagerly: the batch's own layout, with a sink row past it when the counts may leave dummy tokens
    rows = batch + 1 if on_device else batch
    layout = PackedLayout(batch, rows, ids.shape[1], width, tokens)
    heads = np.empty(layout.heads, dtype=np.int64)
    layout.write(heads, starts, fed, None if on_device else drafts)  # type: ignore[arg-type]
    if kept.device is None:  # one upload per revision of the table, shared with the runner's own forwards
        kept.device = runner.to_device(kept.host)
    tables = kept.device
    meta = runner.to_device(torch.from_numpy(heads))
    if on_device:
        layout.split(meta)[2][:batch].copy_(drafts)
        ids = torch.cat((ids, ids.new_zeros(1, ids.shape[1])))
        tables = torch.cat((tables, tables.new_zeros(1, tables.shape[1])))
    meta = torch.cat((meta, tables.reshape(-1)))
    step = graphs.step if graphs is not None else PackedStep(runner.model, runner.cache, runner.backend)
    return step(layout, ids, meta)
