"""The FP8 tile sweep's search space and its rules, as plain functions (the tuner times them on the GPU;
the CPU tests check the rules).

Per (scheme, N, K) the sweep picks one chunk count (it fixes a row's summation order, so it cannot
depend on M) and, per M bucket, the fastest of a few tiles and K-splits (these only move work).
The space is kept small on purpose: each distinct kernel (scheme, tile, warps, stages, split or
not and how its chunk sums are added, weights by pointer or tensor-memory loads, activations
quantized in the GEMM or before) is compiled once, about a second each. Decode sizes (M <= 16)
stream the weights, so their space is the widest: every K-split that keeps the programs within
a few waves, tensor-memory loads with deep pipelines, rows of up to 256 per program, launched
plainly or programmatically dependent (timed back to back, where that launch overlaps the previous
GEMM's end: the decode step in `fp8_probe` is the fair judge of it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from minedraft.engine.cuda.fp8_tiles import Tile, num_blocks

M_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 448, 2048)  # each bucket is timed at its largest M
CHECK_MS = (1, 2, 3, 5, 8, 13, 16, 17, 31, 32, 33, 63, 64, 65, 100, 128, 129, 200, 256, 257, 300, 448, 449,
            1000, 2048)  # rows compared bit for bit against M = 2048
# (block_n, warps, stages, tma, prequant) at 16 tokens; prequant only matters for block weights
SMALL = ((64, 4, 4, False, False), (128, 4, 3, False, False), (128, 4, 4, False, False),
         (64, 4, 6, True, False), (64, 4, 8, True, False), (128, 4, 4, True, False), (128, 4, 6, True, False),
         (256, 4, 3, True, False), (256, 4, 4, True, False), (256, 8, 4, True, False),
         (128, 4, 4, True, True), (256, 4, 4, True, True))
DECODE_M = 16  # buckets up to here use SMALL and the decode splits
RETIME = 8  # M = 8 and 16 time only the fastest RETIME (tile, split) of M = 1 (the same weight stream)
# 128 x 64 tiles and larger need 8 warps: with 4, ptxas spills (the sm_90 compile check, docs/fp8.md)
MID = {32: ((64, 4, 3), (64, 4, 4), (128, 4, 3)), 64: ((64, 4, 3), (64, 4, 4), (128, 8, 3))}
LARGE = ((128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3), (64, 64, 4, 4))  # (block_n, block_t, warps, stages)
PREFILL = ((128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 8, 4))
# The direct form (tokens on the MMA's M side, `engine/cuda/fp8_direct.py`) above DECODE_M, as
# (block_t, block_n, warps, stages, tma): one m64 warpgroup per 64 tokens, at most 128 weight rows per
# warpgroup (three float32 accumulators of m64n128 are 192 registers a thread)
DIRECT = {64: ((64, 64, 4, 4, False), (64, 128, 4, 3, False), (64, 128, 4, 4, True), (64, 256, 8, 3, True)),
          448: ((64, 128, 4, 4, False), (64, 128, 4, 4, True), (128, 128, 8, 3, True), (128, 128, 8, 4, False),
                (64, 256, 8, 3, True)),
          2048: ((128, 128, 8, 3, True), (128, 128, 8, 4, True), (128, 128, 8, 4, False), (64, 256, 8, 4, True))}


def shapes_8b() -> dict[str, tuple[int, int]]:
    """(N, K) of each projection GEMM of the Llama-3-8B shape (q/k/v and gate/up fused)."""
    from minedraft.bench.synthetic_pair import SHAPES

    cfg = SHAPES["llama3-8b"]
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    return {"qkv": (qkv, cfg.hidden_size), "o": (cfg.hidden_size, cfg.num_heads * cfg.head_dim),
            "gate_up": (2 * cfg.intermediate_size, cfg.hidden_size), "down": (cfg.hidden_size, cfg.intermediate_size)}


def tiles_for(scheme: str, m: int) -> list[Tile]:
    """The candidate tiles (split 1) for a bucket timed at M tokens."""
    if m <= DECODE_M:  # each with and without programmatic dependent launch
        return [Tile(bn, 16, w, s, 1, p, False, t, pdl) for bn, w, s, t, p in SMALL if scheme == "block" or not p
                for pdl in (False, True)]
    sizes = DIRECT[min((b for b in DIRECT if m <= b), default=max(DIRECT))]
    direct = [Tile(bn, bt, w, s, 1, True, tma=t, direct=True) for bt, bn, w, s, t in sizes]
    if m <= 64:
        bt = 32 if m <= 32 else 64
        return [Tile(bn, bt, w, s) for bn, w, s in MID[bt]] + direct
    space = LARGE if m <= 448 else PREFILL
    prequant = (False, True) if scheme == "block" else (False,)  # channel activations are always quantized first
    return [Tile(bn, bt, w, s, 1, p) for p in prequant for bn, bt, w, s in space] + direct


def chunk_choices(n: int, k: int, multiprocessors: int, most: int = 3) -> list[int]:
    """Chunk counts worth timing: divisors of K's block count that give a batch of one between one and
    eight programs per multiprocessor (64-row tiles), nearest to three first; and always 1, since one
    chunk spares every larger batch the chunk ends (`pick_chunks`) and a decode GEMM may fill the
    memory bus from fewer programs than multiprocessors."""
    blocks, tiles = num_blocks(k), -(-n // 64)
    fits = [d for d in range(2, blocks + 1) if blocks % d == 0 and multiprocessors <= tiles * d <= 8 * multiprocessors]
    if not fits:
        fits = [next((d for d in range(2, blocks + 1) if blocks % d == 0 and tiles * d >= multiprocessors), blocks)]
    fits = sorted(set(fits), key=lambda d: abs(tiles * d / multiprocessors - 3))
    return sorted({1, *fits[:most]})


CHUNK_TOLERANCE = 0.03  # how much slower at batch one the fewest chunks may be and still be chosen


def pick_chunks(cells: list[Cell]) -> int | None:
    """The shape's chunk count from the batch-one cells: the fewest chunks whose fastest cell is within
    CHUNK_TOLERANCE of the fastest overall. A program that loops over several chunks carries a second
    accumulator and a branch at each chunk's end, which cost the direct form 14-25% from 448 tokens up
    (one H200, `bench/gpu/fp8_chunk_cost.py`); a K-split at batch one needs chunks. None: nothing timed."""
    timed = [c for c in cells if c.us is not None]
    if not timed:
        return None
    fastest_us = min(c.us or 0.0 for c in timed)
    return min(c.chunks for c in timed if (c.us or 0.0) <= fastest_us * (1 + CHUNK_TOLERANCE))


def split_tiles(chunks: int, tile: Tile, n: int, m: int, multiprocessors: int) -> list[Tile]:
    """The tile with the K-splits worth timing: always split 1 (one program loops over the chunks). At
    decode sizes, every divisor of the chunks that keeps the programs within eight per multiprocessor,
    their sums added by the tile's last program (plus, as the reference, every chunk in its own
    program with a second kernel adding them). Above, while the tiles leave multiprocessors idle,
    every chunk in its own program and half of that, both ways of adding (direct tiles: the fused one)."""
    tiles = -(-n // tile.block_n) * -(-m // tile.block_t)
    out = [with_split(tile, 1)]
    if chunks == 1:
        return out
    if m <= DECODE_M:
        out += [with_split(tile, d, fused=True) for d in range(2, chunks + 1)
                if chunks % d == 0 and tiles * d <= 8 * multiprocessors]
        if not tile.tma and not tile.prequant:
            out.append(with_split(tile, chunks))
    elif tiles < 2 * multiprocessors:  # direct tiles: only the fused sums (the second kernel is no faster)
        for d in (chunks, chunks // 2) if chunks % 2 == 0 and chunks > 2 else (chunks,):
            out += [with_split(tile, d, fused=True)] if tile.direct else [with_split(tile, d),
                                                                           with_split(tile, d, fused=True)]
    return out


def with_split(tile: Tile, split: int, fused: bool = False) -> Tile:
    return dataclasses.replace(tile, split=split, fused=fused)


def kernel_keys(scheme: str, chunks: int, tile: Tile) -> tuple[tuple, ...]:
    """What makes Triton compile another kernel: the GEMM's variant, and with a split the reduction's
    chunk count."""
    split = tile.split > 1
    gemm = (scheme, tile.block_n, tile.block_t, tile.warps, tile.stages, split, tile.prequant and scheme == "block",
            tile.fused, tile.split == chunks, tile.tma, tile.pdl, tile.direct)
    return (gemm, ("sum", chunks)) if split and not tile.fused else (gemm,)


@dataclass(slots=True)
class Cell:
    """One timed configuration."""

    scheme: str
    gemm: str
    m: int
    chunks: int
    tile: Tile
    us: float | None = None  # GPU microseconds per GEMM; None: not timed (failed or out of time)
    error: str = ""


def fastest(cells: list[Cell], count: int) -> list[Cell]:
    """The `count` fastest timed cells, fastest first."""
    return sorted((c for c in cells if c.us is not None), key=lambda c: c.us or 0.0)[:count]


def best(cells: list[Cell]) -> Cell | None:
    top = fastest(cells, 1)
    return top[0] if top else None
