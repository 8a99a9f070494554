"""The attention's key splits merged by the launch's last split program against the merge kernel: the same
output (to float32 rounding of a sum taken in another order), decode, verify and packed rows alike, every
arrival count back at zero after each launch; and on CUDA the same inside a CUDA graph, replayed."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.kernel_cases import BLOCK_SIZE, block_table


def _inputs(device: torch.device, dtype: torch.dtype, query_lens: list[int], contexts: list[int], seed: int):
    gen = torch.Generator().manual_seed(seed)
    kv_heads, group, dim = 2, 4, 64
    table, num_blocks = block_table([-(-c // BLOCK_SIZE) for c in contexts], 1, gen)
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, dim, generator=gen).to(dtype)
    q = torch.randn(len(query_lens), max(query_lens), kv_heads * group, dim, generator=gen).to(dtype)
    starts = torch.tensor([c - n for c, n in zip(contexts, query_lens, strict=True)])
    lens = torch.tensor(query_lens)
    return tuple(t.to(device) for t in (q, k_cache, v_cache, table, starts, lens))


def _counts_zero(device: torch.device) -> bool:
    from minedraft.engine.cuda.paged_attention import ATTENTION_ARRIVALS

    counts = ATTENTION_ARRIVALS.by_device.get(device)
    return counts is not None and not counts.any().item()


CASES = [  # (query lens, contexts): decode rows, verify windows with an empty row, a prefill among decodes
    ([1, 1, 1], [1, 130, 700]),
    ([5, 0, 5, 3], [5, 1, 400, 96]),
    ([1, 24, 1], [300, 24, 33]),
]


@pytest.mark.parametrize(("case", "splits", "dtype"), [(0, 7, torch.float32), (1, 3, torch.bfloat16),
                                                      (2, 2, torch.float32)])
def test_the_last_split_merges_as_the_merge_kernel_does(kernel_device: torch.device, case: int, splits: int,
                                                        dtype: torch.dtype) -> None:
    from minedraft.engine.cuda import paged_attention_triton

    query_lens, contexts = CASES[case]
    q, k_cache, v_cache, table, starts, lens = _inputs(kernel_device, dtype, query_lens, contexts, 5 + case)
    scale = q.shape[-1] ** -0.5
    merged = paged_attention_triton(q, k_cache, v_cache, table, starts, lens, scale, num_splits=splits,
                                    fused_merge=False)
    fused = paged_attention_triton(q, k_cache, v_cache, table, starts, lens, scale, num_splits=splits)
    assert _counts_zero(kernel_device), "a launch left an arrival count raised"
    assert not fused.isnan().any()
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # bf16: one rounding of the output apart at most
    torch.testing.assert_close(fused.float(), merged.float(), rtol=tol, atol=tol)

    offsets = torch.cumsum(lens, 0) - lens
    places = torch.tensor([b * q.shape[1] + j for b, n in enumerate(query_lens) for j in range(n)],
                          device=kernel_device)
    packed_q = q.reshape(-1, *q.shape[2:]).index_select(0, places).unsqueeze(0)
    packed = paged_attention_triton(packed_q, k_cache, v_cache, table, starts, lens, scale, num_splits=splits,
                                    q_offsets=offsets, width=q.shape[1])
    assert _counts_zero(kernel_device)
    want = merged.reshape(-1, *q.shape[2:]).index_select(0, places)
    torch.testing.assert_close(packed[0].float(), want.float(), rtol=tol, atol=tol)


def test_a_captured_split_attention_merges_at_every_replay(kernel_device: torch.device) -> None:
    if kernel_device.type != "cuda":
        pytest.skip("CUDA graphs need a CUDA device")
    from minedraft.engine.cuda import paged_attention_triton

    q, k_cache, v_cache, table, starts, lens = _inputs(kernel_device, torch.bfloat16, [1, 1], [90, 600], 9)
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    paged_attention_triton(q, k_cache, v_cache, table, starts, lens, scale, out=out, num_splits=4)  # makes counts
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_attention_triton(q, k_cache, v_cache, table, starts, lens, scale, out=out, num_splits=4)
    for step in range(3):
        q.copy_(torch.randn_like(q))
        graph.replay()
        want = paged_attention_triton(q, k_cache, v_cache, table, starts, lens, scale, num_splits=4,
                                      fused_merge=False)
        torch.cuda.synchronize()
        assert _counts_zero(kernel_device), f"replay {step} left an arrival count raised"
        torch.testing.assert_close(out.float(), want.float(), rtol=1e-2, atol=1e-2)
