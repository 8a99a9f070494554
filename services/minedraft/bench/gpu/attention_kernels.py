"""Decode/verify timing of the Triton paged-attention kernel (`minedraft bench kernels`, CUDA only).

Each figure is a CUDA-graph replay of `reps` launches over disjoint KV regions (>= 512 MiB in
all, so L2 cannot hold them), divided by `reps`: no launch overhead, no cache reuse. `eager`
is one plain launch through the Python wrapper, for comparison. Correctness lives in
tests/gpu (pytest); this only times.
"""

from __future__ import annotations

import argparse
import functools

import torch

from minedraft.core.errors import MinedraftError

BLOCK_SIZE = 16


def time_graph(qs, kc, vc, tables, starts, qlens, outs, splits: int | None, scale: float) -> float:
    """Milliseconds per launch of a captured graph of `len(qs)` launches."""
    import triton

    from minedraft.engine.cuda import paged_attention_triton

    reps = qs.shape[0]

    def run_all() -> None:
        for r in range(reps):
            paged_attention_triton(qs[r], kc, vc, tables[r], starts, qlens, scale, out=outs[r], num_splits=splits)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run_all()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_all()
    return triton.testing.do_bench(graph.replay, return_mode="median") / reps


def time_decode(sweep_splits: bool, device: str = "cuda") -> None:
    import triton

    from minedraft.engine.cuda import paged_attention_triton
    from minedraft.engine.cuda.paged_attention import _choose_splits, _launch_config

    heads, kvh, dim, ctx = 32, 8, 128, 1024
    cols = ctx // BLOCK_SIZE
    scale = dim**-0.5
    print(f"decode benchmark: H={heads} Hkv={kvh} D={dim} bf16, context {ctx}, do_bench median")
    header = f"{'B':>4} {'Q':>3} {'splits':>6} {'graph us':>9} {'KV GB/s':>9} {'eager us':>9}"
    print(header + ("  best forced split" if sweep_splits else ""))
    for width in (1, 5):
        for batch in (1, 2, 4, 8, 16, 32, 64):
            kv_bytes = 2 * batch * ctx * kvh * dim * 2
            reps = max(2, min(256, -(-(512 << 20) // kv_bytes)))
            num_blocks = reps * batch * cols
            tables = torch.randperm(num_blocks, device=device).view(reps, batch, cols)
            kc = torch.randn(num_blocks, BLOCK_SIZE, kvh, dim, device=device, dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            qs = torch.randn(reps, batch, width, heads, dim, device=device, dtype=torch.bfloat16)
            outs = torch.empty_like(qs)
            starts = torch.full((batch,), ctx - width, dtype=torch.long, device=device)
            qlens = torch.full((batch,), width, dtype=torch.long, device=device)
            rows = width * (heads // kvh)
            block_m, block_n = _launch_config(rows, dim)[:2]
            splits = _choose_splits(triton.cdiv(rows, block_m) * batch * kvh, cols * BLOCK_SIZE, block_n, qs.device)
            ms = time_graph(qs, kc, vc, tables, starts, qlens, outs, None, scale)
            eager_call = functools.partial(
                paged_attention_triton, qs[0], kc, vc, tables[0], starts, qlens, scale, out=outs[0]
            )
            eager = triton.testing.do_bench(eager_call, return_mode="median")
            line = f"{batch:>4} {width:>3} {splits:>6} {ms * 1e3:>9.1f} {kv_bytes / (ms * 1e-3) / 1e9:>9.1f} "
            line += f"{eager * 1e3:>9.1f}"
            if sweep_splits:
                forced = {n: time_graph(qs, kc, vc, tables, starts, qlens, outs, n, scale) for n in (1, 2, 4, 8, 16)}
                best = min(forced, key=forced.__getitem__)
                line += f"  {best:>2}: {kv_bytes / (forced[best] * 1e-3) / 1e9:7.1f} GB/s"
            print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise MinedraftError("`minedraft bench kernels` times the Triton kernels on a CUDA device; none is here")
    time_decode(args.sweep_splits)
    return 0
