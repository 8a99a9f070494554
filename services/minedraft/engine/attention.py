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
    folded_masks: dict[int, torch.Tensor] | None = None  # torch: key_mask per query-head group size, [B, 1, G*Q, L]


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
    device = starts.device
    offsets = torch.arange(width, device=device).unsqueeze(0)
    valid_q = offsets < query_lens.unsqueeze(1)
    positions = torch.where(valid_q, starts.unsqueeze(1) + offsets, 0)
    blocks = torch.gather(block_tables, 1, (positions // block_size).clamp(max=block_tables.shape[1] - 1))
    slots = blocks * block_size + positions % block_size
    slot_mapping = torch.where(valid_q, slots, torch.full_like(slots, -1))
    meta = AttentionMetadata(positions, slot_mapping, block_tables, starts, query_lens, sliding_window, backend)
    if backend == "torch":
        _torch_extras(meta, valid_q, block_size)
    return meta


def _torch_extras(meta: AttentionMetadata, valid_q: torch.Tensor, block_size: int) -> None:
    """Key blocks, the visibility mask and the write indices, computed once for all layers."""
    positions, block_tables = meta.positions, meta.block_tables
    context_lens = torch.where(valid_q, positions + 1, torch.zeros_like(positions)).amax(dim=1)
    max_len = int(context_lens.max().item()) if positions.shape[0] else 0
    num_blocks = max(1, -(-max_len // block_size))
    table = block_tables[:, :num_blocks]
    if table.shape[1] < num_blocks:  # a caller's table narrower than the context: pad with block 0 (masked)
        table = F.pad(table, (0, num_blocks - table.shape[1]))
    meta.key_blocks = table.reshape(-1)
    key_pos = torch.arange(num_blocks * block_size, device=positions.device)
    visible = key_pos.view(1, 1, -1) <= positions.unsqueeze(-1)
    if meta.sliding_window is not None:
        visible &= key_pos.view(1, 1, -1) > positions.unsqueeze(-1) - meta.sliding_window
    visible &= valid_q.unsqueeze(-1)
    # Padded query rows see key 0 so their softmax stays finite; their outputs are ignored.
    visible[..., 0] |= ~valid_q
    meta.key_mask = visible.unsqueeze(1)
    if not bool(valid_q.all()):
        meta.write_tokens = valid_q.reshape(-1).nonzero().squeeze(1)
        meta.write_slots = meta.slot_mapping.reshape(-1).index_select(0, meta.write_tokens)


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


def _folded_mask(meta: AttentionMetadata, group: int) -> torch.Tensor:
    """key_mask repeated for the `group` query heads folded into the query axis (row g*Q + q)."""
    assert meta.key_mask is not None
    if meta.folded_masks is None:
        meta.folded_masks = {}
    mask = meta.folded_masks.get(group)
    if mask is None:
        batch, _, width, keys = meta.key_mask.shape
        mask = meta.key_mask.expand(batch, group, width, keys).reshape(batch, 1, group * width, keys)
        meta.folded_masks[group] = mask
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
                                      meta.sliding_window)
    assert meta.key_blocks is not None and meta.key_mask is not None
    batch, width, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    keys_len = meta.key_mask.shape[-1]
    # Whole blocks, in each row's order: [B, L, Hkv, D] -> [B, Hkv, L, D] (a view).
    keys = k_cache.index_select(0, meta.key_blocks).view(batch, keys_len, kv_heads, dim).transpose(1, 2)
    values = v_cache.index_select(0, meta.key_blocks).view(batch, keys_len, kv_heads, dim).transpose(1, 2)
    # Query head h = kv_head * group + g; rows of one KV head: [B, Hkv, G*Q, D].
    folded = q.reshape(batch, width, kv_heads, group, dim).permute(0, 2, 3, 1, 4).reshape(
        batch, kv_heads, group * width, dim)
    out = F.scaled_dot_product_attention(folded.to(keys.dtype), keys, values, attn_mask=_folded_mask(meta, group),
                                         scale=scale)
    out = out.to(q.dtype).view(batch, kv_heads, group, width, dim).permute(0, 3, 1, 2, 4)
    return out.reshape(batch, width, heads, dim)
