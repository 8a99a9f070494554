"""Which tiles the FP8 GEMM (`fp8_gemm.py`) launches for a shape and a batch: a tuned table, or a default.

Two kinds of choice live here. `chunks`, how many pieces a row's K sum is cut into, fixes the
summation order, so it is one number per (scheme, N, K) and never depends on M: that is what keeps
a row's bits the same in every batch (SD == AR). Everything chosen per M (tile sizes, warps,
pipeline stages, how many programs share the chunks along K and how their chunk sums are added,
whether the weights stream through the tensor memory accelerator, whether block activations are
quantized by a kernel of their own first) only changes the speed.

The table is JSON (`bench/gpu/fp8_tune.py` writes it; `fp8_tiles.json` beside this file is the
committed one, `MINEDRAFT_FP8_TILES=path` names another), read on the first GEMM:

    {"format": 1, "device": "...", "multiprocessors": 132,
     "shapes": {"block:6144x4096": {"chunks": 4, "buckets": [
         {"max_m": 1, "block_n": 64, "block_t": 16, "warps": 4, "stages": 4, "split": 4, "prequant": false,
          "fused": true, "tma": true, "pdl": true},
         ...]}}}

A bucket serves every M up to its max_m (the last one every M above too); `fused`, `tma`, `pdl` and
`direct` may be left out (false). Shapes not in the table, and entries that fail validation, take the default below.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

BLOCK_K = 128  # the K block every chunk is made of (the block layout's group width)
TABLE_ENV = "MINEDRAFT_FP8_TILES"
COMMITTED = Path(__file__).with_name("fp8_tiles.json")
FORMAT = 1
BLOCK_N_CHOICES = (32, 64, 128, 256)
BLOCK_T_CHOICES = (16, 32, 64, 128, 256)
WARP_CHOICES = (4, 8)


@dataclass(frozen=True, slots=True)
class Tile:
    """One launch's speed choices (the order-fixing `chunks` is kept per shape, in `ShapeTiles`)."""

    block_n: int  # weight rows per program (the MMA's M side)
    block_t: int  # tokens per program (the MMA's N side, 16 at least)
    warps: int
    stages: int
    split: int = 1  # programs along K; each takes chunks // split whole chunks (1: one program loops)
    prequant: bool = False  # block scheme: quantize activations in a kernel of their own first
    fused: bool = False  # split: the last program of a tile adds the chunk sums (else a second kernel)
    tma: bool = False  # weights loaded by the tensor memory accelerator (Hopper), else by pointer loads
    pdl: bool = False  # programmatic dependent launch (Hopper): weights prefetched while the previous kernel ends
    direct: bool = False  # tokens on the MMA's M side (`fp8_direct.py`, many tokens): activations quantized first

    def check(self, chunks: int) -> None:
        if self.block_n not in BLOCK_N_CHOICES or self.block_t not in BLOCK_T_CHOICES:
            raise ValueError(f"tile {self.block_n}x{self.block_t} is not one the kernel takes")
        if self.warps not in WARP_CHOICES or not 1 <= self.stages <= 8:
            raise ValueError(f"{self.warps} warps / {self.stages} stages are not supported")
        if self.split < 1 or chunks % self.split:
            raise ValueError(f"split {self.split} does not divide the {chunks} chunks")
        if self.fused and self.split == 1:
            raise ValueError("fused chunk sums need a split")
        if self.direct and (self.block_t < 64 or self.block_n < 64 or self.pdl or not self.prequant):
            raise ValueError("a direct tile takes 64+ tokens and weight rows, quantized activations, a plain launch")


@dataclass(frozen=True, slots=True)
class Bucket:
    max_m: int
    tile: Tile


@dataclass(frozen=True, slots=True)
class ShapeTiles:
    chunks: int
    buckets: tuple[Bucket, ...]  # ascending max_m

    def tile(self, m: int) -> Tile:
        for bucket in self.buckets:
            if m <= bucket.max_m:
                return bucket.tile
        return self.buckets[-1].tile


def shape_key(scheme: str, n: int, k: int) -> str:
    return f"{scheme}:{n}x{k}"


def num_blocks(k: int) -> int:
    return -(-k // BLOCK_K)


def default_chunks(n: int, k: int, multiprocessors: int) -> int:
    """The fewest chunks (a divisor of K's block count) that give a batch of one at least two programs
    per multiprocessor with 64-row tiles: a function of the shape and the device alone."""
    blocks = num_blocks(k)
    tiles = -(-n // 64)
    for d in range(1, blocks + 1):
        if blocks % d == 0 and tiles * d >= 2 * multiprocessors:
            return d
    return blocks


def default_tile(scheme: str, n: int, m: int, chunks: int, multiprocessors: int) -> Tile:
    """The untuned choice: transposed 16- and 32-token tiles for decode, the direct form above (64 tokens by
    128 weight rows through the tensor memory accelerator, 64 by 256 past 448 tokens: the fastest direct
    tiles of the 8B shapes' tuning on Hopper), split along K while the tiles alone would leave
    multiprocessors idle."""
    if m <= 32:
        block_n, block_t, warps, stages, direct = 64, 16 if m <= 16 else 32, 4, 4, False
    elif m <= 448:
        block_n, block_t, warps, stages, direct = 128, 64, 4, 4, True
    else:
        block_n, block_t, warps, stages, direct = 256, 64, 8, 4, True
    tiles = -(-n // block_n) * -(-m // block_t)
    split = chunks if chunks > 1 and tiles < multiprocessors else 1
    return Tile(block_n, block_t, warps, stages, split, prequant=direct, fused=split > 1, tma=direct, direct=direct)


def parse_shape(entry: dict, k: int) -> ShapeTiles:
    """One table entry, validated against K (chunks must divide its block count)."""
    chunks = int(entry["chunks"])
    if chunks < 1 or num_blocks(k) % chunks:
        raise ValueError(f"{chunks} chunks do not divide K's {num_blocks(k)} blocks")
    buckets = []
    for raw in sorted(entry["buckets"], key=lambda b: int(b["max_m"])):
        tile = Tile(int(raw["block_n"]), int(raw["block_t"]), int(raw["warps"]), int(raw["stages"]),
                    int(raw.get("split", 1)), bool(raw.get("prequant", False)), bool(raw.get("fused", False)),
                    bool(raw.get("tma", False)), bool(raw.get("pdl", False)), bool(raw.get("direct", False)))
        tile.check(chunks)
        buckets.append(Bucket(int(raw["max_m"]), tile))
    if not buckets:
        raise ValueError("no buckets")
    return ShapeTiles(chunks, tuple(buckets))


@dataclass(frozen=True, slots=True)
class TileTable:
    shapes: dict[str, ShapeTiles]
    source: str  # the file it came from, or why the defaults serve
    rejected: tuple[str, ...] = ()  # entries that failed validation, with the reason

    def shape(self, scheme: str, n: int, k: int) -> ShapeTiles | None:
        return self.shapes.get(shape_key(scheme, n, k))


def parse_table(data: dict, source: str) -> TileTable:
    if int(data.get("format", 0)) != FORMAT:
        return TileTable({}, f"{source}: format {data.get('format')!r} is not {FORMAT}; defaults serve")
    shapes: dict[str, ShapeTiles] = {}
    rejected: list[str] = []
    for key, entry in data.get("shapes", {}).items():
        try:
            k = int(key.split(":", 1)[1].split("x", 1)[1])
            shapes[key] = parse_shape(entry, k)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            rejected.append(f"{key}: {exc}")
    return TileTable(shapes, source, tuple(rejected))


def load_table(path: Path | None) -> TileTable:
    """The table at `path` (None or a missing file: no entries, every shape takes the default)."""
    if path is None or not path.is_file():
        return TileTable({}, f"{path}: no such file; defaults serve")
    return parse_table(json.loads(path.read_text()), str(path))


def table_path() -> Path:
    named = os.environ.get(TABLE_ENV)
    return Path(named) if named else COMMITTED


@functools.cache
def active_table() -> TileTable:
    """The table this process uses, read once on first use (MINEDRAFT_FP8_TILES or the committed one)."""
    path = table_path()
    if os.environ.get(TABLE_ENV) and not path.is_file():
        raise FileNotFoundError(f"{TABLE_ENV}={path} names no file")
    return load_table(path)


def choose(table: TileTable, scheme: str, n: int, k: int, m: int, multiprocessors: int) -> tuple[int, Tile]:
    """(chunks, tile) for an M x K by K x N product: the table's entry for the shape, else the default."""
    entry = table.shape(scheme, n, k)
    if entry is not None:
        return entry.chunks, entry.tile(m)
    chunks = default_chunks(n, k, multiprocessors)
    return chunks, default_tile(scheme, n, m, chunks, multiprocessors)


def to_json(shapes: dict[str, ShapeTiles], device: str, multiprocessors: int, notes: dict | None = None) -> dict:
    """The table in the format `parse_table` reads."""
    return {"format": FORMAT, "device": device, "multiprocessors": multiprocessors, "notes": notes or {},
            "shapes": {key: {"chunks": s.chunks, "buckets": [{"max_m": b.max_m, **asdict(b.tile)}
                                                             for b in s.buckets]} for key, s in shapes.items()}}
