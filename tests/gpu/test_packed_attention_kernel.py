"""The Triton paged attention over packed queries (a TETRIS verify's tokens one row after another) against the
same kernel over the [B, Q] layout: every valid query's output is the same bits, the packed output's other
tokens (a packed step's dummies) are left as they were, with and without key splits; and the packed metadata
gives each token the position and KV slot the padded metadata gives its place in the layout."""

from __future__ import annotations

import pytest
import torch

from minedraft.engine.attention import build_metadata, packed_metadata
from tests.gpu.kernel_cases import BLOCK_SIZE, block_table


def _rows(query_lens: list[int], width: int, dummies: int) -> torch.Tensor:
    """Each packed token's flat place in the [B, width] layout, then `dummies` in the last row's slot 0."""
    places = [b * width + j for b, n in enumerate(query_lens) for j in range(n)]
    return torch.tensor(places + [(len(query_lens) - 1) * width] * dummies, dtype=torch.long)


def test_packed_metadata_matches_padded_at_each_tokens_place() -> None:
    gen = torch.Generator().manual_seed(3)
    query_lens, width = [3, 1, 0, 5, 0], 5  # the last row has no query: the dummies' sink
    contexts = [40, 17, 9, 70, 1]
    starts = torch.tensor([c - n for c, n in zip(contexts, query_lens, strict=True)])
    table, _ = block_table([-(-c // BLOCK_SIZE) for c in contexts], 2, gen)
    lens = torch.tensor(query_lens)
    padded = build_metadata(starts, lens, width, table, BLOCK_SIZE, backend="triton")
    rows = _rows(query_lens, width, dummies=3)
    packed = packed_metadata(starts, lens, torch.cumsum(lens, 0) - lens, rows, width, table, BLOCK_SIZE)
    real = sum(query_lens)
    assert torch.equal(packed.positions[0, :real], padded.positions.reshape(-1)[rows[:real]])
    assert torch.equal(packed.slot_mapping[0, :real], padded.slot_mapping.reshape(-1)[rows[:real]])
    assert (packed.slot_mapping[0, real:] == -1).all()  # dummies write no KV
    assert packed.q_offsets is not None and packed.q_offsets.tolist() == [0, 3, 4, 4, 9]
    assert packed.packed_width == width


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_queries_equal_the_padded_layout(kernel_device: torch.device, splits: int, dtype: torch.dtype) -> None:
    from minedraft.engine.cuda import paged_attention_triton

    gen = torch.Generator().manual_seed(11 + splits)
    query_lens, width, kv_heads, group, dim = [4, 1, 0, 6, 2, 0], 6, 2, 4, 64
    contexts = [50, 20, 33, 130, 7, 1]
    heads = kv_heads * group
    starts = torch.tensor([c - n for c, n in zip(contexts, query_lens, strict=True)])
    table, num_blocks = block_table([-(-c // BLOCK_SIZE) for c in contexts], 1, gen)
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, dim, generator=gen).to(dtype).to(kernel_device)
    v_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, dim, generator=gen).to(dtype).to(kernel_device)
    q = torch.randn(len(query_lens), width, heads, dim, generator=gen).to(dtype).to(kernel_device)
    lens, table, starts = (t.to(kernel_device) for t in (torch.tensor(query_lens), table, starts))
    padded = paged_attention_triton(q, k_cache, v_cache, table, starts, lens, dim**-0.5, num_splits=splits)

    dummies = 3
    rows = _rows(query_lens, width, dummies).to(kernel_device)
    packed_q = q.reshape(-1, heads, dim).index_select(0, rows).unsqueeze(0)
    offsets = torch.cumsum(lens, 0) - lens
    sentinel = torch.full_like(packed_q, 7.0)
    out = paged_attention_triton(packed_q, k_cache, v_cache, table, starts, lens, dim**-0.5, out=sentinel.clone(),
                                 num_splits=splits, q_offsets=offsets, width=width)
    real = sum(query_lens)
    want = padded.reshape(-1, heads, dim).index_select(0, rows[:real])
    assert torch.equal(out[0, :real], want)
    assert torch.equal(out[0, real:], sentinel[0, real:])  # no row's query: never written


def test_packed_queries_need_their_width(kernel_device: torch.device) -> None:
    from minedraft.engine.cuda import paged_attention_triton

    q = torch.zeros(1, 4, 8, 64, device=kernel_device)
    cache = torch.zeros(4, BLOCK_SIZE, 2, 64, device=kernel_device)
    one = torch.ones(2, dtype=torch.long, device=kernel_device)
    with pytest.raises(ValueError, match="width"):
        paged_attention_triton(q, cache, cache, one.view(2, 1), one, one, 0.1, q_offsets=one)
