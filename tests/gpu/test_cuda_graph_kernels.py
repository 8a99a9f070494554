"""CUDA only: the kernels captured in a CUDA graph read their metadata from device memory, so a
replay after the metadata changed in place computes what an eager launch computes."""

from __future__ import annotations

import torch

BLOCK_SIZE = 16


def test_graph_replay_follows_metadata_changed_in_place(cuda_device: torch.device) -> None:
    from minedraft.engine.cuda import paged_attention_triton, write_kv_triton

    device = cuda_device
    gen = torch.Generator().manual_seed(1)
    batch, width, kvh, grp, dim, cols = 4, 5, 8, 4, 128, 72
    heads = kvh * grp
    num_blocks = batch * cols
    table = torch.randperm(num_blocks, generator=gen).view(batch, cols).to(device)
    kc = torch.randn(num_blocks, BLOCK_SIZE, kvh, dim, generator=gen).bfloat16().to(device)
    vc = torch.randn(num_blocks, BLOCK_SIZE, kvh, dim, generator=gen).bfloat16().to(device)
    q = torch.randn(batch, width, heads, dim, generator=gen).bfloat16().to(device)
    k = torch.randn(batch, width, kvh, dim, generator=gen).bfloat16().to(device)
    v = torch.randn(batch, width, kvh, dim, generator=gen).bfloat16().to(device)
    starts = torch.zeros(batch, dtype=torch.long, device=device)
    qlens = torch.zeros(batch, dtype=torch.long, device=device)
    slots = torch.full((batch, width), -1, dtype=torch.long, device=device)
    out = torch.empty_like(q)

    def step() -> None:
        write_kv_triton(kc, vc, k, v, slots)
        paged_attention_triton(q, kc, vc, table, starts, qlens, dim**-0.5, out=out)

    def set_meta(start_list: list[int], qlen_list: list[int]) -> None:
        starts.copy_(torch.tensor(start_list))
        qlens.copy_(torch.tensor(qlen_list))
        offs = torch.arange(width, device=device)
        pos = starts.unsqueeze(1) + offs
        slot = table.gather(1, pos // BLOCK_SIZE) * BLOCK_SIZE + pos % BLOCK_SIZE
        slots.copy_(torch.where(offs < qlens.unsqueeze(1), slot, -1))

    set_meta([10, 200, 511, 900], [5, 1, 3, 5])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    set_meta([700, 3, 1000, 64], [2, 5, 1, 4])
    graph.replay()
    got = out.clone()
    step()
    torch.cuda.synchronize()
    valid = torch.arange(width, device=device) < qlens.unsqueeze(1)
    assert torch.equal(got[valid], out[valid])
