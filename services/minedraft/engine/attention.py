"""Attention over a paged KV cache.

A batch is laid out as [B, Q] query tokens (padded): a row may be a prefill chunk, a
single decode token or a k+1-token verify window. Everything the layers need about
where tokens live is computed once per forward in `AttentionMetadata`; the inner
attention is one function (`paged_attention`) so a fused CUDA kernel can replace the
plain-torch reference without the scheduler or the model noticing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
    kv_gather: torch.Tensor | None = None  # torch backend: [B, L] flat KV slot of key positions 0..L-1
    key_mask: torch.Tensor | None = None  # torch backend: [B, 1, Q, L] True where the query may attend


def build_metadata(
    starts: torch.Tensor,
    query_lens: torch.Tensor,
    width: int,
    block_tables: torch.Tensor,
    block_size: int,
    sliding_window: int | None = None,
    backend: str = "torch",
) -> AttentionMetadata:
    """Derive positions and slot mapping (and, for the torch backend, key gathers and masks).

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
        meta.kv_gather, meta.key_mask = _reference_masks(positions, valid_q, block_tables, block_size, sliding_window)
    return meta


def _reference_masks(
    positions: torch.Tensor,
    valid_q: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
    sliding_window: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    context_lens = torch.where(valid_q, positions + 1, torch.zeros_like(positions)).amax(dim=1)
    max_len = int(context_lens.max().item()) if positions.shape[0] else 0
    key_pos = torch.arange(max_len, device=positions.device)
    kv_blocks = block_tables[:, (key_pos // block_size).clamp(max=block_tables.shape[1] - 1)]
    kv_gather = kv_blocks * block_size + key_pos % block_size
    visible = key_pos.view(1, 1, -1) <= positions.unsqueeze(-1)
    if sliding_window is not None:
        visible &= key_pos.view(1, 1, -1) > positions.unsqueeze(-1) - sliding_window
    visible &= valid_q.unsqueeze(-1)
    # Padded query rows see key 0 so their softmax stays finite; their outputs are ignored.
    visible[..., 0] |= ~valid_q
    return kv_gather, visible.unsqueeze(1)


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
) -> None:
    """Store this step's keys/values ([B, Q, Hkv, D]) into their paged slots."""
    slot_mapping = meta.slot_mapping
    if meta.backend == "triton":
        from minedraft.engine.cuda.paged_attention import write_kv_triton

        write_kv_triton(k_cache, v_cache, k, v, slot_mapping)
        return
    flat_slots = slot_mapping.reshape(-1)
    keep = flat_slots >= 0
    idx = flat_slots[keep]
    k_flat = k_cache.view(-1, *k_cache.shape[2:])
    v_flat = v_cache.view(-1, *v_cache.shape[2:])
    k_flat.index_copy_(0, idx, k.reshape(-1, *k.shape[2:])[keep].to(k_cache.dtype))
    v_flat.index_copy_(0, idx, v.reshape(-1, *v.shape[2:])[keep].to(v_cache.dtype))


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
    assert meta.kv_gather is not None and meta.key_mask is not None
    batch, width, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    keys = k_cache.view(-1, kv_heads, dim)[meta.kv_gather]  # [B, L, Hkv, D]
    values = v_cache.view(-1, kv_heads, dim)[meta.kv_gather]
    qg = q.view(batch, width, kv_heads, group, dim).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, Q, D]
    kt = keys.permute(0, 2, 3, 1).unsqueeze(2)  # [B, Hkv, 1, D, L]
    scores = torch.matmul(qg.float(), kt.float()) * scale  # [B, Hkv, G, Q, L]
    mask = meta.key_mask.unsqueeze(2)  # [B, 1, 1, Q, L]
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = torch.matmul(probs, values.permute(0, 2, 1, 3).unsqueeze(2))  # [B, Hkv, G, Q, D]
    return out.permute(0, 3, 1, 2, 4).reshape(batch, width, heads, dim)
