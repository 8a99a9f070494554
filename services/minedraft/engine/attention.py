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
    kv_gather: torch.Tensor  # [B, L] flat KV slot of each key position 0..L-1
    key_mask: torch.Tensor  # [B, 1, Q, L] True where the query may attend the key


def build_metadata(
    positions: torch.Tensor,
    query_lens: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
    sliding_window: int | None = None,
) -> AttentionMetadata:
    """Derive slot mapping, key gather indices and causal masks for one forward.

    positions: [B, Q] positions of the new tokens; query_lens: [B] valid tokens per row;
    block_tables: [B, max_blocks] physical block ids (padding entries are never read).
    """
    batch, width = positions.shape
    device = positions.device
    valid_q = torch.arange(width, device=device).unsqueeze(0) < query_lens.unsqueeze(1)
    blocks = torch.gather(block_tables, 1, (positions // block_size).clamp(max=block_tables.shape[1] - 1))
    slots = blocks * block_size + positions % block_size
    slot_mapping = torch.where(valid_q, slots, torch.full_like(slots, -1))

    context_lens = torch.where(valid_q, positions + 1, torch.zeros_like(positions)).amax(dim=1)
    max_len = int(context_lens.max().item()) if batch else 0
    key_pos = torch.arange(max_len, device=device)
    kv_blocks = block_tables[:, (key_pos // block_size).clamp(max=block_tables.shape[1] - 1)]
    kv_gather = kv_blocks * block_size + key_pos % block_size

    visible = key_pos.view(1, 1, -1) <= positions.unsqueeze(-1)
    if sliding_window is not None:
        visible &= key_pos.view(1, 1, -1) > positions.unsqueeze(-1) - sliding_window
    visible &= valid_q.unsqueeze(-1)
    # Padded query rows see key 0 so their softmax stays finite; their outputs are ignored.
    visible[..., 0] |= ~valid_q
    return AttentionMetadata(
        positions=positions,
        slot_mapping=slot_mapping,
        kv_gather=kv_gather,
        key_mask=visible.unsqueeze(1),
    )


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store this step's keys/values ([B, Q, Hkv, D]) into their paged slots."""
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
    """Reference attention: q [B, Q, H, D] against paged keys/values -> [B, Q, H, D]."""
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
