"""Attention over a paged KV cache.

A batch is laid out as [B, Q] query tokens (padded): a row may be a prefill chunk, a
single decode token or a k+1-token verify window. Everything the layers need about
where tokens live is computed once per forward in `AttentionMetadata`; the inner
attention is one function (`paged_attention`) so a fused CUDA kernel can replace the
plain-torch path without the scheduler or the model noticing.

The torch path (CPU, and the reference the CUDA kernels are checked against) copies each
row's whole KV blocks out of the cache with one `index_select` per tensor and runs torch's
fused scaled-dot-product attention over them, with the query heads that share a KV head
folded into one query axis (no copy of K/V per query head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass(slots=True)
class AttentionMetadata:
    """Where each query token sits and which cached keys it may see."""

    positions: torch.Tensor  # [B, Q] absolute position of each query token (pad: 0)
    slot_mapping: torch.Tensor  # [B, Q] flat KV slot to write (pad: -1)
    block_tables: torch.Tensor  # [B, max_blocks]
    starts: torch.Tensor  # [B] position of each row's first query token
    query_lens: torch.Tensor  # [B] valid query tokens per row
    sliding_window: int | None = None
    backend: str = "torch"  # "torch" (reference, any device) or "triton" (CUDA kernels)
    key_blocks: torch.Tensor | None = None  # torch: [B * n] blocks holding key positions 0..n*block_size-1 per row
    key_mask: torch.Tensor | None = None  # torch: [B, 1, Q, L] True where the query may attend
    write_tokens: torch.Tensor | None = None  # torch: flat [B*Q] indices of the real tokens (None: all are)
    write_slots: torch.Tensor | None = None  # torch: KV slot of each written token
    folded_masks: dict | None = None  # torch: additive masks per (query-head group, dtype), [B, 1, Q*G|1, L]
    q_offsets: torch.Tensor | None = None  # triton, packed: [B] each row's first token in q, positions, slots [1, N]
    packed_width: int = 0  # triton, packed: the widest row's query tokens (the attention grid's Q)


def build_metadata(
    starts: torch.Tensor,
    query_lens: torch.Tensor,
    width: int,
    block_tables: torch.Tensor,
    block_size: int,
    sliding_window: int | None = None,
    backend: str = "torch",
) -> AttentionMetadata:
    """Derive positions and slot mapping (and, for the torch backend, key blocks, masks and
    write indices).

    starts/query_lens: [B]; block_tables: [B, max_blocks] physical block ids (padding entries
    are never read). The triton backend path does no host synchronisation, so it can run
    inside a captured CUDA graph.
    """
    if backend == "torch":
        return _torch_metadata(starts, query_lens, width, block_tables, block_size, sliding_window)
    device = starts.device
    offsets = torch.arange(width, device=device).unsqueeze(0)
    valid_q = offsets < query_lens.unsqueeze(1)
    positions = torch.where(valid_q, starts.unsqueeze(1) + offsets, 0)
    blocks = torch.gather(block_tables, 1, (positions // block_size).clamp(max=block_tables.shape[1] - 1))
    slots = blocks * block_size + positions % block_size
    slot_mapping = torch.where(valid_q, slots, torch.full_like(slots, -1))
    return AttentionMetadata(positions, slot_mapping, block_tables, starts, query_lens, sliding_window, backend)


def packed_metadata(
    starts: torch.Tensor,
    query_lens: torch.Tensor,
    offsets: torch.Tensor,
    rows: torch.Tensor,
    width: int,
    block_tables: torch.Tensor,
    block_size: int,
    sliding_window: int | None = None,
) -> AttentionMetadata:
    """The triton path's metadata for packed tokens (engine/ragged.py): row b's tokens start at offsets[b], and token t
    is query rows[t] % width of row rows[t] // width of the [B, width] layout; one that is no row's valid query (a
    dummy) writes no KV. Positions and slots are per token, [1, N], and the attention reads q packed from each row's
    offset, so the layers never scatter their tokens into the [B, width] layout. No host synchronisation."""
    row, within = rows // width, rows % width
    valid = within < query_lens[row]
    positions = torch.where(valid, starts[row] + within, 0)
    column = (positions // block_size).clamp(max=block_tables.shape[1] - 1)
    blocks = block_tables.reshape(-1)[row * block_tables.shape[1] + column]
    slots = torch.where(valid, blocks * block_size + positions % block_size, -1)
    return AttentionMetadata(positions.unsqueeze(0), slots.unsqueeze(0), block_tables, starts, query_lens,
                             sliding_window, "triton", q_offsets=offsets, packed_width=width)


def _torch_metadata(
    starts: torch.Tensor,
    query_lens: torch.Tensor,
    width: int,
    block_tables: torch.Tensor,
    block_size: int,
    sliding_window: int | None,
) -> AttentionMetadata:
    """The torch path's metadata, in as few small ops as possible: on a CPU every op costs a few
    microseconds whatever its size, and this runs once per forward for all layers."""
    offsets = torch.arange(width, device=starts.device)
    positions = starts.unsqueeze(1) + offsets
    full = bool((query_lens == width).all())  # steady decode and verify steps: no padding
    valid_q = None if full else offsets < query_lens.unsqueeze(1)
    if valid_q is not None:
        positions = positions.masked_fill_(~valid_q, 0)
    block_index = positions.div(block_size, rounding_mode="floor").clamp_(max=block_tables.shape[1] - 1)
    slots = block_tables.gather(1, block_index).mul_(block_size).add_(positions % block_size)
    slot_mapping = slots if valid_q is None else slots.masked_fill_(~valid_q, -1)
    meta = AttentionMetadata(positions, slot_mapping, block_tables, starts, query_lens, sliding_window, "torch")
    max_len = int((starts + query_lens).max()) if positions.shape[0] else 0
    num_blocks = max(1, -(-max_len // block_size))
    table = block_tables[:, :num_blocks]
    if table.shape[1] < num_blocks:  # a caller's table narrower than the context: pad with block 0 (masked)
        table = F.pad(table, (0, num_blocks - table.shape[1]))
    meta.key_blocks = table.reshape(-1)
    key_pos = torch.arange(num_blocks * block_size, device=positions.device)
    visible = key_pos <= positions.unsqueeze(-1)  # [B, Q, L]
    if sliding_window is not None:
        visible &= key_pos > positions.unsqueeze(-1) - sliding_window
    if valid_q is not None:
        visible &= valid_q.unsqueeze(-1)
        # Padded query rows see key 0 so their softmax stays finite; their outputs are ignored.
        visible[..., 0] |= ~valid_q
        meta.write_tokens = valid_q.reshape(-1).nonzero().squeeze(1)
        meta.write_slots = slot_mapping.reshape(-1).index_select(0, meta.write_tokens)
    meta.key_mask = visible.unsqueeze(1)
    return meta


def take_rows(x: torch.Tensor, pick: torch.Tensor) -> torch.Tensor:
    """x [B, Q, ...] at the query indices pick [B, n] -> [B, n, ...]."""
    index = pick.view(*pick.shape, *([1] * (x.dim() - 2))).expand(*pick.shape, *x.shape[2:])
    return x.gather(1, index)


def select_queries(meta: AttentionMetadata, pick: torch.Tensor) -> AttentionMetadata:
    """The torch path's metadata for the queries at pick [B, n] alone (their keys are stored already)."""
    assert meta.key_mask is not None, "select_queries needs the torch path's metadata"
    mask = meta.key_mask
    index = pick.view(pick.shape[0], 1, pick.shape[1], 1).expand(-1, 1, -1, mask.shape[-1])
    positions = meta.positions.gather(1, pick)
    return AttentionMetadata(positions, meta.slot_mapping.gather(1, pick), meta.block_tables, meta.starts,
                             meta.query_lens, meta.sliding_window, meta.backend, key_blocks=meta.key_blocks,
                             key_mask=mask.gather(2, index))


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
) -> None:
    """Store this step's keys/values ([B, Q, Hkv, D]) into their paged slots."""
    slot_mapping = meta.slot_mapping
    if meta.backend == "triton":
        from minedraft.engine.cuda.paged_attention import write_kv_triton

        write_kv_triton(k_cache, v_cache, k, v, slot_mapping)
        return
    k_rows = k.reshape(-1, *k.shape[2:])
    v_rows = v.reshape(-1, *v.shape[2:])
    if meta.write_tokens is not None and meta.write_slots is not None:
        k_rows, v_rows = k_rows.index_select(0, meta.write_tokens), v_rows.index_select(0, meta.write_tokens)
        idx = meta.write_slots
    elif meta.key_mask is not None:  # built by build_metadata: every token is real
        idx = slot_mapping.reshape(-1)
    else:  # metadata assembled by hand: drop the padding (slot -1) here
        flat_slots = slot_mapping.reshape(-1)
        keep = flat_slots >= 0
        idx, k_rows, v_rows = flat_slots[keep], k_rows[keep], v_rows[keep]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, idx, k_rows.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, idx, v_rows.to(v_cache.dtype))


def _additive_mask(meta: AttentionMetadata, group: int, dtype: torch.dtype) -> torch.Tensor:
    """key_mask as SDPA's additive mask (0 / -inf) for `group` query heads folded into the query
    axis (row q * group + g), built once per forward and shared by every layer."""
    assert meta.key_mask is not None
    if meta.folded_masks is None:
        meta.folded_masks = {}
    key = (group, dtype)
    mask = meta.folded_masks.get(key)
    if mask is None:
        visible = meta.key_mask
        batch, _, width, keys = visible.shape
        if width > 1:  # one decode token per row broadcasts over the group as it is
            visible = visible.unsqueeze(3).expand(batch, 1, width, group, keys).reshape(batch, 1, width * group, keys)
        mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
        meta.folded_masks[key] = mask
    return mask


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Attention of q [B, Q, H, D] against paged keys/values -> [B, Q, H, D]."""
    if meta.backend == "triton":
        from minedraft.engine.cuda.paged_attention import paged_attention_triton

        return paged_attention_triton(q, k_cache, v_cache, meta.block_tables, meta.starts, meta.query_lens, scale,
                                      meta.sliding_window, q_offsets=meta.q_offsets, width=meta.packed_width)
    assert meta.key_blocks is not None and meta.key_mask is not None
    batch, width, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    keys_len = meta.key_mask.shape[-1]
    # Whole blocks, in each row's order: [B, L, Hkv, D] -> [B, Hkv, L, D] (a view).
    keys = k_cache.index_select(0, meta.key_blocks).view(batch, keys_len, kv_heads, dim).transpose(1, 2)
    values = v_cache.index_select(0, meta.key_blocks).view(batch, keys_len, kv_heads, dim).transpose(1, 2)
    # Query head h = kv_head * group + g; the rows of one KV head, [B, Hkv, Q*G, D] (a view for Q = 1).
    folded = q.reshape(batch, width, kv_heads, group, dim).transpose(1, 2).reshape(batch, kv_heads, width * group, dim)
    out = F.scaled_dot_product_attention(folded.to(keys.dtype), keys, values,
                                         attn_mask=_additive_mask(meta, group, keys.dtype), scale=scale)
    out = out.to(q.dtype).view(batch, kv_heads, width, group, dim).transpose(1, 2)
    return out.reshape(batch, width, heads, dim)
