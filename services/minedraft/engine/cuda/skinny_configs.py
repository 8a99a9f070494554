"""The few-row GEMM's configs: tile shapes, forms and the shortlists the BLAS plan times.

A config names its form (`dot`, `swap`, `fma`: `skinny_gemm.py`), its row, feature and K tiles, warps and
pipeline stages. `CONFIGS` is the sweep space (`bench/gpu/skinny_sweep.py`); the shortlists are the few worth
timing per row tile when a CUDA graph is captured.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class SkinnyConfig:
    form: str  # "dot", "swap" or "fma"
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    split: int = 1  # programs per output tile along K (`skinny_split.py`); 1: one walks the whole K axis

    @property
    def name(self) -> str:
        tail = f"k{self.split}" if self.split > 1 else ""
        return f"{self.form}{self.block_m}x{self.block_n}x{self.block_k}w{self.warps}s{self.stages}{tail}"

    def fits(self, rows: int) -> bool:
        return rows <= self.block_m

    def staged_bytes(self, element_size: int, glu: bool = False) -> int:
        """Shared memory a dot config's pipelined x and W tiles take (fma configs keep theirs in registers); a
        gated GEMM stages two W tiles."""
        if self.form == "fma":
            return 0
        return (self.block_m + self.block_n * (2 if glu else 1)) * self.block_k * element_size * self.stages


SMEM = 160 << 10  # staged tiles a config may ask for: a Hopper SM has 228 KB, with room kept to spare
# Verify windows of 65-128 rows (batch 16 at k = 4 is 80) still only stream their weight: one 128-row tile reads
# it once. Beyond, the weight would be re-read per row tile and cuBLAS's own tiles win.
MAX_ROWS = 128


def _configs() -> tuple[SkinnyConfig, ...]:
    out = [SkinnyConfig("fma", 1, bn, bk, w, s) for bn in (4, 8, 16) for bk in (256, 512) for w in (2, 4)
           for s in (2, 3, 4)]
    for bm in (16, 32, 64):
        out += [SkinnyConfig("dot", bm, bn, bk, 4, s) for bn in (16, 32, 64) for bk in (128, 256) for s in (3, 4)]
        out += [SkinnyConfig("dot", bm, bn, 256, 4, 5) for bn in (16, 32)]
        out += [SkinnyConfig("swap", bm, bn, bk, 4, s) for bn in (64, 128) for bk in (64, 128, 256)
                for s in (2, 3, 4)]
        out += [SkinnyConfig("dot", bm, 64, 128, 8, 3), SkinnyConfig("dot", bm, 128, 64, 8, 3)]
    # 128 rows: the rows on the tensor cores' short side (swap; up to 256 there) or a full 128-row tile (dot), the
    # wider accumulators with 8 warps as well
    out += [SkinnyConfig("swap", 128, 64, bk, w, s) for bk in (64, 128) for w in (4, 8) for s in (2, 3, 4)]
    out += [SkinnyConfig("swap", 128, 128, bk, 8, s) for bk in (64, 128) for s in (2, 3, 4)]
    out += [SkinnyConfig("dot", 128, bn, 128, w, s) for bn in (32, 64) for w in (4, 8) for s in (2, 3)]
    plain = [c for c in out if c.staged_bytes(2) <= SMEM]
    # K split over 2 or 4 programs per tile, for the narrowest grids: the 32- and 64-row tiles of the plain
    # shortlist (below) and the 128-row tiles that came closest to the libraries on q/k/v, o and down at 80 rows,
    # in the sweep space only until timings choose them for the shortlist.
    split = [dataclasses.replace(c, split=n) for c in plain for n in (2, 4)
             if c.name in _SPLIT_BASES]
    return tuple(plain + split)


_SPLIT_BASES = ("swap32x64x128w4s4", "swap32x64x256w4s3", "dot32x16x256w4s4", "dot32x32x128w4s4",
                "dot64x32x128w4s4", "dot64x64x128w4s4", "swap64x128x128w4s3", "swap64x64x128w4s3",
                "swap128x64x128w4s3", "swap128x64x64w4s4", "dot128x32x128w8s3")
CONFIGS = _configs()
BY_NAME = {c.name: c for c in CONFIGS}
# The configs the BLAS plan times for a shape, per row tile: on one H100 those with the best geometric mean
# over the 8B shape's five projections (the head's included), within 1-4% of the best of 80-110 configs on
# average, and the best one where a projection differs (`bench/gpu/skinny_sweep.py`, docs/benchmarks/gpu.md).
# Timing every config at start-up would cost seconds.
SHORTLIST = {
    1: ("fma1x8x512w4s3", "fma1x16x512w4s3", "fma1x4x512w4s3"),
    16: ("swap16x64x256w4s4", "swap16x128x128w4s4", "swap16x64x128w4s4", "dot16x32x256w4s4"),
    32: ("swap32x64x128w4s4", "swap32x64x256w4s3", "swap32x128x128w4s3", "dot32x16x256w4s4"),
    64: ("dot64x32x128w4s4", "dot64x64x128w4s4", "swap64x128x128w4s3"),
    # at 80 rows on one H100 the 128-row tiles beat cuBLASLt only on the head (365 against 377 us) and draw with it
    # on gate/up; qkv, o and down stay 1.2-1.6x the libraries' (docs/benchmarks/gpu.md)
    128: ("swap128x128x64w8s3", "swap128x64x64w4s4"),
}
# The gated GEMM stages two weight tiles per K step, so most of the plain shortlist's tiles fit only with fewer
# stages: the same tiles with as many stages as fit (the gated form streams twice the bytes per stage).
GLU_SHORTLIST = {
    1: ("fma1x8x512w4s3", "fma1x4x512w4s3", "fma1x8x256w4s3"),
    16: ("swap16x64x128w4s4", "swap16x64x256w4s2", "swap16x128x128w4s2", "dot16x32x256w4s3"),
    32: ("swap32x64x128w4s3", "swap32x128x128w4s2", "swap32x64x64w4s4", "dot32x16x256w4s4"),
    64: ("dot64x32x128w4s4", "dot64x64x128w4s3", "swap64x64x128w4s3"),
    128: ("swap128x64x64w4s3", "swap128x64x64w8s3"),  # gate/up + silu*up at 80 rows: 88.0 / 89.8 against 90.7 us
}


def configs_for(rows: int, element_size: int = 2) -> list[SkinnyConfig]:
    """Every config that runs `rows` rows of `element_size`-byte elements with the smallest row tile that holds
    them (a larger one would only pad)."""
    if rows < 1 or rows > MAX_ROWS:
        return []
    block_m = max(16, 1 << (rows - 1).bit_length())
    fitting = [c for c in CONFIGS if c.form in ("dot", "swap") and c.block_m == block_m
               and c.staged_bytes(element_size) <= SMEM]
    if rows == 1:
        fitting = [c for c in CONFIGS if c.form == "fma"] + fitting
    return fitting


def shortlist_for(rows: int, element_size: int = 2, glu: bool = False) -> list[SkinnyConfig]:
    """The configs worth timing for `rows` rows: the row tile's shortlist (at one row, the one-row forms'), those
    whose staged tiles fit when gated too where `glu`."""
    if rows < 1 or rows > MAX_ROWS:
        return []
    block_m = max(16, 1 << (rows - 1).bit_length())
    table = GLU_SHORTLIST if glu else SHORTLIST
    names = table[1] if rows == 1 else table[block_m]
    return [BY_NAME[n] for n in names if BY_NAME[n].staged_bytes(element_size, glu) <= SMEM]
