"""The paged attention's split merge done by each tile's last split (arrival counts) against the second merge
kernel it replaces: the same outputs (padding tokens zero, packed dummies untouched), and every count back at
zero afterwards, so the next launch (or a CUDA graph's replay) starts clean."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.kernel_cases import BLOCK_SIZE, block_table


@pytest.mark.parametrize("splits", [2, 5])
@pytest.mark.parametrize("width", [1, 3])
def test_fused_merge_equals_the_merge_kernel(kernel_device: torch.device, monkeypatch: pytest.MonkeyPatch,
                                             splits: int, width: int) -> None:
    from minedraft.engine.cuda import paged_attention, paged_attention_triton
    from minedraft.engine.cuda.fp8_launch import ARRIVAL_COUNTS

    gen = torch.Generator().manual_seed(splits * 10 + width)
    contexts, kv_heads, group, dim = [37, 90, 5], 2, 4, 64
    query_lens = [min(width, c) for c in contexts]
    query_lens[1] = max(0, width - 1)  # a row with fewer queries than the width (padding) or none
    starts = torch.tensor([c - n for c, n in zip(contexts, query_lens, strict=True)])
    table, num_blocks = block_table([-(-c // BLOCK_SIZE) for c in contexts], 1, gen)
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, dim, generator=gen).to(kernel_device)
    v_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, dim, generator=gen).to(kernel_device)
    q = torch.randn(len(contexts), width, kv_heads * group, dim, generator=gen).to(kernel_device)
    lens, table, starts = (t.to(kernel_device) for t in (torch.tensor(query_lens), table, starts))

    fused = paged_attention_triton(q, k_cache, v_cache, table, starts, lens, dim**-0.5, num_splits=splits)
    counts = ARRIVAL_COUNTS.by_device[kernel_device]
    assert int(counts.abs().sum()) == 0  # every tile's last split left its count at zero
    with monkeypatch.context() as patch:  # as inside a capture that finds no counts: the second kernel merges
        patch.setattr(paged_attention.ARRIVAL_COUNTS, "get", lambda *args: None)
        second = paged_attention_triton(q, k_cache, v_cache, table, starts, lens, dim**-0.5, num_splits=splits)
    torch.testing.assert_close(fused, second, rtol=1e-5, atol=1e-6)
    for b, n in enumerate(query_lens):
        assert (fused[b, n:] == 0).all()  # padding tokens and the empty row come back as zeros
    single = paged_attention_triton(q, k_cache, v_cache, table, starts, lens, dim**-0.5, num_splits=1)
    torch.testing.assert_close(fused, single, rtol=1e-4, atol=1e-5)
