"""Verify windows of per-row lengths that cost what they verify.

With TETRIS (engine/tetris.py) row b of a verify checks 1 + lengths[b] tokens, not k + 1. In the
padded [B, Q] layout the projections and MLPs would still run on B x Q rows, so verifying fewer
tokens would save nothing (and drafting k + extra would make it dearer). Here every linear layer
and MLP runs on the valid tokens alone, packed [1, N, hidden]; only each layer's attention sees the
[B, Q] layout, through a scatter of its qkv projection and a gather of its output (model.py's
`rows`), so the attention kernels and their metadata are unchanged.

These steps run eagerly, never as CUDA graphs: a packed step's shape is its token count, which
changes with every selection, and a graph per count (or per bucket of counts) would multiply the
captured set that `--capture-batch` closes. On a verify big enough for TETRIS to pay (compute-bound,
tens of ms on an 8B model) the launches of an eager step are a few per cent of it.

The logits come back left-aligned [B, k+1, V]: slot j of row b is the distribution after its first
j drafts, for j <= lengths[b] (later slots repeat slot lengths[b]), as the rejection rule reads them.
A runner that overrides its step (hidden-state capture for an EAGLE head) keeps its own padded path
with per-row query lengths, and its logits are aligned the same way.
"""

from __future__ import annotations

import torch

from minedraft.engine.attention import build_metadata
from minedraft.engine.runner import TABLE_MULTIPLE, ModelRunner
from minedraft.engine.sequence import SeqState


def packs(runner: ModelRunner) -> bool:
    """Whether the runner's step is the plain one, which a packed forward may stand in for."""
    return type(runner).run is ModelRunner.run


def verify_logits(runner: ModelRunner, states: list[SeqState], drafts: torch.Tensor, lengths: list[int],
                  whole: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Target logits [B, k+1, V], left-aligned, for each row's uncached tokens and first lengths[b] drafts
    (drafts [B, k] on the device, -1 past a row's length); with `whole` also every fed position's logits
    ([B, W, V], rows right-aligned, as the verifier's prompt logprobs read them)."""
    k = drafts.shape[1]
    seq_ids = [st.seq_id for st in states]
    starts = [st.cached for st in states]
    if all(st.length - st.cached == 1 for st in states):  # steady state: the drafts stay on the device
        last = runner.to_device(torch.tensor([st.tokens[-1] for st in states], dtype=torch.long))
        ids = torch.cat((last.unsqueeze(1), drafts.clamp(min=0)), dim=1)
        query_lens = [1 + n for n in lengths]
    else:
        host = drafts.tolist()
        feed = [st.uncached() + row[:n] for st, row, n in zip(states, host, lengths, strict=True)]
        query_lens = [len(f) for f in feed]
        width = max(query_lens)
        ids = runner.to_device(torch.tensor([f + [0] * (width - len(f)) for f in feed], dtype=torch.long))
    if not whole and packs(runner):
        return packed_forward(runner, seq_ids, ids, starts, query_lens, lengths, k + 1), None
    full = runner.forward_ids(seq_ids, ids, starts, query_lens, last_n=max(query_lens))
    width = full.shape[1]
    slot = torch.arange(k + 1).unsqueeze(0)
    n = torch.tensor(lengths).unsqueeze(1)
    index = runner.to_device(width - 1 - n + torch.minimum(slot, n))
    window = full.gather(1, index.unsqueeze(-1).expand(-1, -1, full.shape[-1]))
    return window, full if whole else None


@torch.inference_mode()
def packed_forward(runner: ModelRunner, seq_ids: list[int], ids: torch.Tensor, starts: list[int],
                   query_lens: list[int], lengths: list[int], width: int) -> torch.Tensor:
    """Logits [B, width, V] of each row's last 1 + lengths[b] fed tokens (left-aligned; later slots repeat
    the row's last), computed with the layers on the packed valid tokens."""
    for seq_id, start, n in zip(seq_ids, starts, query_lens, strict=True):
        runner.cache.allocator.ensure(seq_id, start + n)
    tables = runner.cache.block_table_tensor(seq_ids, "cpu", TABLE_MULTIPLE if runner.backend == "triton" else 1,
                                             runner.max_blocks_per_seq)
    q = ids.shape[1]
    qlens = torch.tensor(query_lens, dtype=torch.long)
    offsets = torch.cumsum(qlens, 0) - qlens  # where each row's tokens begin among the packed ones
    rows = torch.cat([b * q + torch.arange(n) for b, n in enumerate(query_lens)])
    slot = torch.arange(width).unsqueeze(0)
    first = (qlens - 1 - torch.tensor(lengths)).unsqueeze(1)  # the row's last committed token
    picked = offsets.unsqueeze(1) + first + torch.minimum(slot, torch.tensor(lengths).unsqueeze(1))
    meta = build_metadata(runner.to_device(torch.tensor(starts, dtype=torch.long)), runner.to_device(qlens), q,
                          runner.to_device(tables), runner.cache.block_size, runner.config.sliding_window,
                          runner.backend)
    model = runner.model
    hidden = model(ids, meta, runner.cache.layers, packed=(runner.to_device(rows), runner.to_device(picked)))
    return model.logits(hidden)
