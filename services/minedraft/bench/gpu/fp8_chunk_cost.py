"""`python3 -m minedraft.bench.gpu.fp8_chunk_cost`: what a program's chunk ends cost the direct FP8 GEMM.

The chunk count fixes a row's summation order, so it is one number per shape (8 for the 8B q/k/v, o and
down, for the decode split); this times the direct form's tiles on those shapes with 8, 4, 2 and one
chunk (timing only: a different chunk count gives different bits), CUDA-graph replays over rotating
weight copies as the tuner times them.
"""

from __future__ import annotations

import torch

from minedraft.bench.gpu.fp8_tune import graph_us, rotated_weights
from minedraft.engine.cuda.fp8_gemm import fp8_gemm_with
from minedraft.engine.cuda.fp8_tiles import Tile

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "down": (4096, 14336)}
TILES = (Tile(128, 64, 4, 4, 1, True, tma=True, direct=True), Tile(256, 64, 8, 4, 1, True, tma=True, direct=True))


def main() -> int:
    for name, (n, k) in SHAPES.items():
        weights, _ = rotated_weights(n, k, "block")
        for m in (448, 2048):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for tile in TILES:
                row = [f"{name} m={m} {tile.block_n}x{tile.block_t}"]
                for chunks in (8, 4, 2, 1):
                    us = graph_us([lambda w=w, c=chunks, t=tile, x=x: fp8_gemm_with(x, w, c, t) for w in weights])
                    row.append(f"chunks {chunks}: {us:.1f}")
                print(" | ".join(row), flush=True)
        weights.clear()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
