"""`python3 -m minedraft.bench.gpu.fp8_m1_anatomy [--out OUT.json] [--shapes qkv,o,gate_up,down]`: the
batch-one FP8 GEMM taken apart.

The transposed GEMM of `engine/cuda/fp8_gemm.py` at one token, block weights, pointer loads, on the 8B shapes,
beside variants of one program per (weight tile, K split) that each drop a part of its work (timing only;
only `same` computes the right numbers):

    prod   the production kernel with this tile
    same   its arithmetic: per 128-wide block, quantize the token, tensor-core product, scale, add
    chain  the products chained in the accumulator, no per-block scaling
    wonly  the weights streamed through the tensor cores against a constant token (no token loads, no quantizing)
    empty  the same grid writing its output tile and nothing else (the launch)

each split one with the tile's last program adding the chunk sums (`+tail`, as production's fused sums; with
their count a compile-time constant, `+tail_unrolled`) and without. Timed as the tuner times (CUDA-graph
replays over rotating weight copies past L2), beside the bound (the weight's bytes over the measured copy
bandwidth).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from minedraft.bench.gpu.fp8_tune import graph_us, rotated_weights
from minedraft.bench.gpu.timing import ceilings
from minedraft.engine.cuda.fp8_blocks import GROUP, _quantize
from minedraft.engine.cuda.fp8_chunks import add_chunk_sums, arrived_last
from minedraft.engine.cuda.fp8_gemm import fp8_gemm_with
from minedraft.engine.cuda.fp8_launch import ARRIVAL_COUNTS
from minedraft.engine.cuda.fp8_tiles import Tile
from minedraft.engine.fp8_weights import ACT_EPS, Fp8Weight

MODES = {"same": 0, "chain": 1, "wonly": 2, "empty": 3}
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
TILES = ((128, 4, 3), (64, 4, 4))  # (weight rows, warps, stages)
SPLITS = (1, 2, 4, 8)


@triton.jit
def _sums_unrolled(total, parts, tile_mask, MN, CHUNKS: tl.constexpr):
    """add_chunk_sums with the count known when compiling: every chunk's load issued before the first add."""
    for c in tl.static_range(CHUNKS):
        total += tl.load(parts + c * MN, mask=tile_mask, other=0.0, cache_modifier=".cg")
    return total


@triton.jit
def _anatomy_kernel(x_ptr, w_ptr, ws_ptr, out_ptr, part_ptr, count_ptr, N, K, stride_ws, kb_per_prog,
                    MODE: tl.constexpr, TAIL: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
                    EPS: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_t = tl.arange(0, 16)
    offs_k = tl.arange(0, GROUP)
    n_mask = offs_n < N
    t_mask = offs_t < 1
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * K
    scale_rows = ws_ptr + (offs_n // 128) * stride_ws
    kb_lo = tl.program_id(2) * kb_per_prog
    acc = tl.zeros((BLOCK_N, 16), tl.float32)
    ones = tl.full((16, GROUP), 1.0, tl.float32).to(tl.float8e4nv)
    if MODE < 3:
        for kb in range(kb_lo, kb_lo + kb_per_prog):
            k = kb * GROUP + offs_k
            w = tl.load(w_rows + k[None, :])
            if MODE == 2:
                acc = tl.dot(w, tl.trans(ones), acc)
            else:
                x = tl.load(x_ptr + offs_t[:, None] * 0 + k[None, :], mask=t_mask[:, None], other=0.0)
                xq, xs = _quantize(x.to(tl.float32), EPS)
                if MODE == 0:
                    ws = tl.load(scale_rows + kb, mask=n_mask, other=0.0)
                    acc += tl.dot(w, tl.trans(xq)) * (ws[:, None] * xs[None, :])
                else:
                    acc = tl.dot(w, tl.trans(xq), acc)
    tile_mask = n_mask[:, None] & t_mask[None, :]
    parts = part_ptr + offs_t[None, :] * N + offs_n[:, None]
    tl.store(parts + tl.program_id(2) * N, acc, mask=tile_mask)
    if TAIL:
        count = count_ptr + tl.program_id(0)
        if arrived_last(count, tl.num_programs(2)):
            if TAIL == 2:
                total = _sums_unrolled(tl.zeros((BLOCK_N, 16), tl.float32), parts, tile_mask, N, SPLIT)
            else:
                total = add_chunk_sums(tl.zeros((BLOCK_N, 16), tl.float32), parts, tile_mask, N, tl.num_programs(2))
            out = out_ptr + offs_t[None, :] * N + offs_n[:, None]
            tl.store(out, total.to(out_ptr.dtype.element_ty), mask=tile_mask)
            tl.store(count, 0)


def launcher(x: torch.Tensor, weight: Fp8Weight, mode: str, tail: int, tile: tuple[int, int, int],
             split: int) -> Callable[[], object]:
    n, k = weight.out_features, weight.in_features
    block_n, warps, stages = tile
    out = torch.empty(1, n, device=x.device, dtype=x.dtype)
    part = torch.empty(split, 1, n, device=x.device, dtype=torch.float32)
    counts = ARRIVAL_COUNTS.get(x.device, triton.cdiv(n, block_n))
    grid = (triton.cdiv(n, block_n), 1, split)

    def run() -> None:
        _anatomy_kernel[grid](x, weight.qweight, weight.scale, out, part, counts, n, k, weight.scale.stride(0),
                              k // 128 // split, MODE=MODES[mode], TAIL=tail, SPLIT=split, BLOCK_N=block_n, EPS=ACT_EPS,
                              num_warps=warps, num_stages=stages)
    return run


def shape_rows(name: str, n: int, k: int, copy_bps: float) -> list[dict]:
    weights, _ = rotated_weights(n, k, "block")
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    chunks = 1 if name == "gate_up" else 8  # the committed table's chunk counts
    rows = []
    for tile in TILES:
        for split in SPLITS:
            row: dict[str, object] = {"gemm": name, "tile": "{}w{}s{}".format(*tile), "split": split,
                                      "bound_us": round(n * k / copy_bps * 1e6, 2)}
            if chunks % split == 0:
                prod = Tile(tile[0], 16, tile[1], tile[2], split, False, fused=split > 1)
                row["prod"] = round(graph_us([lambda w=w, t=prod: fp8_gemm_with(x, w, chunks, t) for w in weights]), 2)
            for mode in MODES:
                for tail in (1, 2, 0) if split > 1 else (0,):
                    calls = [launcher(x, w, mode, tail, tile, split) for w in weights]
                    row[mode + ("", "+tail", "+tail_unrolled")[tail]] = round(graph_us(calls), 2)
            print(json.dumps(row), flush=True)
            rows.append(row)
    weights.clear()
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m minedraft.bench.gpu.fp8_m1_anatomy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="fp8_m1_anatomy.json")
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args(argv)
    copy_bps = ceilings()["copy_GBps"] * 1e9
    rows = [row for name in args.shapes.split(",") for row in shape_rows(name, *SHAPES[name], copy_bps)]
    result = {"device": torch.cuda.get_device_name(), "copy_GBps": copy_bps / 1e9, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
