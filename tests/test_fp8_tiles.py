"""The FP8 tile table (`engine/cuda/fp8_tiles.py`) and the tuner's search space (`bench/gpu/fp8_space.py`):
loading, validation, selection per M, and the rule SD == AR rests on: a shape's chunk count (its rows'
summation order) is the same at every M, whatever the table says per bucket. No GPU, no timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minedraft.bench.gpu import fp8_space as space
from minedraft.bench.gpu.fp8_compile import sweep_jobs
from minedraft.engine.cuda import fp8_tiles as tiles
from minedraft.engine.cuda.fp8_tiles import Bucket, ShapeTiles, Tile, TileTable

SMS = 132


def entry(chunks: int = 4, **bucket: object) -> dict:
    first = {"max_m": 1, "block_n": 64, "block_t": 16, "warps": 4, "stages": 4, "split": chunks, "prequant": False}
    last = {"max_m": 2048, "block_n": 128, "block_t": 128, "warps": 8, "stages": 3, "split": 1, "prequant": True}
    return {"chunks": chunks, "buckets": [{**first, **bucket}, last]}


def write(tmp_path: Path, shapes: dict, fmt: int = 1) -> Path:
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps({"format": fmt, "device": "test", "multiprocessors": SMS, "shapes": shapes}))
    return path


def test_the_committed_table_loads_without_rejections() -> None:
    table = tiles.load_table(tiles.COMMITTED)
    assert not table.rejected
    for key, shape in table.shapes.items():
        n, k = map(int, key.split(":")[1].split("x"))
        assert tiles.num_blocks(k) % shape.chunks == 0 and n > 0


def test_a_table_entry_serves_its_buckets_and_the_last_serves_every_larger_m(tmp_path: Path) -> None:
    table = tiles.load_table(write(tmp_path, {"block:6144x4096": entry()}))
    assert table.source.endswith("tiles.json") and not table.rejected
    assert tiles.choose(table, "block", 6144, 4096, 1, SMS) == (4, Tile(64, 16, 4, 4, 4, False))
    for m in (2, 448, 2048, 100_000):
        assert tiles.choose(table, "block", 6144, 4096, m, SMS) == (4, Tile(128, 128, 8, 3, 1, True))


def test_other_shapes_and_schemes_take_the_default(tmp_path: Path) -> None:
    table = tiles.load_table(write(tmp_path, {"block:6144x4096": entry()}))
    for scheme, n, k in (("channel", 6144, 4096), ("block", 4096, 4096)):
        chunks = tiles.default_chunks(n, k, SMS)
        for m in (1, 16, 64, 300):
            assert tiles.choose(table, scheme, n, k, m, SMS) == (chunks, tiles.default_tile(scheme, n, m, chunks, SMS))


@pytest.mark.parametrize("bad, reason", [
    ({"chunks": 3}, "do not divide"),  # 32 blocks of K
    ({"split": 3}, "does not divide"),
    ({"block_t": 8}, "not one the kernel takes"),
    ({"warps": 2}, "not supported"),
    ({"split": 1, "fused": True}, "need a split"),
])
def test_invalid_entries_are_rejected_with_the_reason_and_fall_back(tmp_path: Path, bad: dict, reason: str) -> None:
    raw = entry(int(bad.pop("chunks", 4)), **bad)
    table = tiles.load_table(write(tmp_path, {"block:6144x4096": raw, "block:4096x4096": entry()}))
    assert "block:6144x4096" not in table.shapes and "block:4096x4096" in table.shapes
    assert len(table.rejected) == 1 and reason in table.rejected[0]


def test_missing_files_and_other_formats_mean_defaults(tmp_path: Path) -> None:
    assert tiles.load_table(tmp_path / "none.json").shapes == {}
    table = tiles.load_table(write(tmp_path, {"block:6144x4096": entry()}, fmt=2))
    assert table.shapes == {} and "format" in table.source


def test_the_env_var_names_the_table_and_a_missing_one_is_an_error(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, {"channel:4096x14336": entry(7, split=7)})
    monkeypatch.setenv(tiles.TABLE_ENV, str(path))
    tiles.active_table.cache_clear()
    try:
        assert tiles.active_table().source == str(path)
        assert tiles.choose(tiles.active_table(), "channel", 4096, 14336, 1, SMS)[0] == 7
        monkeypatch.setenv(tiles.TABLE_ENV, str(tmp_path / "gone.json"))
        tiles.active_table.cache_clear()
        with pytest.raises(FileNotFoundError):
            tiles.active_table()
    finally:
        monkeypatch.delenv(tiles.TABLE_ENV)
        tiles.active_table.cache_clear()


def test_to_json_round_trips() -> None:
    shape = ShapeTiles(2, (Bucket(1, Tile(64, 16, 4, 6, 2, fused=True, tma=True)),
                           Bucket(2048, Tile(128, 64, 8, 4, 1, True))))
    data = json.loads(json.dumps(tiles.to_json({"block:28672x4096": shape}, "H200", SMS, {"x": 1})))
    assert tiles.parse_table(data, "mem").shapes == {"block:28672x4096": shape}


def test_chunks_never_depend_on_m() -> None:
    """Default or tabled, a shape's chunk count is one number across M: the summation order."""
    table = TileTable({"block:6144x4096": ShapeTiles(8, (Bucket(16, Tile(64, 16, 4, 3, 8)),
                                                         Bucket(10**9, Tile(128, 128, 8, 3))))}, "mem")
    for scheme, (n, k) in [(s, nk) for s in ("block", "channel") for nk in space.shapes_8b().values()]:
        assert len({tiles.choose(table, scheme, n, k, m, SMS)[0] for m in space.CHECK_MS}) == 1


@pytest.mark.parametrize("gemm", ["qkv", "o", "gate_up", "down"])
def test_the_search_space_only_holds_choices_the_kernel_takes(gemm: str) -> None:
    n, k = space.shapes_8b()[gemm]
    choices = space.chunk_choices(n, k, SMS)
    assert 1 in choices and len(choices) <= 4 and all(tiles.num_blocks(k) % c == 0 for c in choices)
    for chunks in choices:
        for m in space.M_BUCKETS:
            for tile in space.tiles_for("block", m):
                assert tile.block_t >= min(16, m) and (m <= 16) == (tile.block_t == 16)
                splits = space.split_tiles(chunks, tile, n, m, SMS)
                assert splits[0] == space.with_split(tile, 1) and len(set(splits)) == len(splits)
                for split in splits:
                    split.check(chunks)
                    assert split.fused or split.split == 1 or split.split == chunks or m > space.DECODE_M
                    if m <= space.DECODE_M:  # decode programs stay within eight per multiprocessor
                        assert split.split == 1 or -(-n // tile.block_n) * split.split <= 8 * SMS


def test_decode_splits_cover_every_divisor_that_fits() -> None:
    """o (4096 x 4096) with 16 chunks and 128-row tiles (32 of them): splits 1, 2, 4, 8, 16 fused, 16 by a
    second kernel; 256-row tensor-memory tiles have no second-kernel reference."""
    pointer = space.split_tiles(16, Tile(128, 16, 4, 4), 4096, 1, SMS)
    assert [(t.split, t.fused) for t in pointer] == [(1, False), (2, True), (4, True), (8, True), (16, True),
                                                     (16, False)]
    tma = space.split_tiles(16, Tile(256, 16, 4, 4, tma=True), 4096, 1, SMS)
    assert [(t.split, t.fused, t.tma) for t in tma] == [(1, False, True), (2, True, True), (4, True, True),
                                                        (8, True, True), (16, True, True)]
    assert space.split_tiles(1, Tile(64, 16, 4, 4), 28672, 1, SMS) == [Tile(64, 16, 4, 4)]


def test_the_sweep_compiles_each_kernel_once_and_stays_small() -> None:
    jobs = sweep_jobs(["block", "channel"], SMS)
    seen: set[tuple] = set()
    for scheme, _, _, _, chunks, tile in jobs:  # every job compiles something no earlier one did
        keys = set(space.kernel_keys(scheme, chunks, tile))
        assert not keys <= seen
        seen |= keys
    assert len({key for key in seen if key[0] != "sum"}) <= 380  # about 35 s in the tuner's 14 workers
    direct = [tile for *_, tile in jobs if tile.direct]
    assert direct and all(tile.prequant and (tile.split == 1 or tile.fused) for tile in direct)
    later = sweep_jobs(["block", "channel"], SMS, min_m=32)  # --min-m 32: nothing for the decode buckets
    assert later and all(m >= 32 for _, _, _, m, _, _ in later)
    assert all(not tile.prequant or tile.direct for scheme, *_, tile in jobs if scheme == "channel")
    assert all(tile.split > 1 for *_, tile in jobs if tile.fused)


def test_best_ignores_failed_cells() -> None:
    cells = [space.Cell("block", "o", 1, 4, Tile(64, 16, 4, 3), us=None, error="out of resources"),
             space.Cell("block", "o", 1, 4, Tile(64, 16, 4, 4), us=9.0),
             space.Cell("block", "o", 1, 4, Tile(128, 16, 4, 3), us=7.5)]
    assert space.best(cells) is cells[2] and space.best(cells[:1]) is None


def test_fused_tma_and_pdl_are_read_and_default_to_off(tmp_path: Path) -> None:
    table = tiles.load_table(write(tmp_path, {"block:6144x4096": entry(8, split=4, fused=True, tma=True, pdl=True),
                                              "block:4096x4096": entry()}))
    assert tiles.choose(table, "block", 6144, 4096, 1, SMS)[1] == Tile(64, 16, 4, 4, 4, False, True, True, True)
    assert tiles.choose(table, "block", 4096, 4096, 1, SMS)[1] == Tile(64, 16, 4, 4, 4, False, False, False, False)


def test_untimed_buckets_keep_the_base_tile_only_with_the_same_chunks() -> None:
    from minedraft.bench.gpu.fp8_tune import kept_tile

    base = TileTable({"block:6144x4096": ShapeTiles(8, (Bucket(16, Tile(128, 16, 4, 4, 8, fused=True)),
                                                        Bucket(10**9, Tile(128, 128, 8, 3))))}, "mem")
    assert kept_tile(base, "block", 6144, 4096, 16, 8, SMS) == Tile(128, 16, 4, 4, 8, fused=True)
    assert kept_tile(base, "block", 6144, 4096, 300, 8, SMS) == Tile(128, 128, 8, 3)
    assert kept_tile(base, "block", 6144, 4096, 16, 4, SMS) == tiles.default_tile("block", 6144, 16, 4, SMS)
    assert kept_tile(base, "channel", 6144, 4096, 1, 8, SMS) == tiles.default_tile("channel", 6144, 1, 8, SMS)


def test_direct_tiles_are_read_and_held_to_what_that_kernel_takes(tmp_path: Path) -> None:
    """A direct bucket (tokens on the MMA's M side) loads as such; one the direct kernel cannot run (fewer
    than 64 tokens, a dependent launch, activations not quantized first) rejects the shape."""
    direct = {"max_m": 64, "block_n": 128, "block_t": 64, "warps": 4, "stages": 4, "split": 4, "prequant": True,
              "fused": True, "direct": True}
    good = entry(4)
    good["buckets"].insert(1, direct)
    table = tiles.load_table(write(tmp_path, {"block:6144x4096": good}))
    assert not table.rejected
    assert tiles.choose(table, "block", 6144, 4096, 40, SMS)[1] == Tile(128, 64, 4, 4, 4, True, True, direct=True)
    assert not tiles.choose(table, "block", 6144, 4096, 65, SMS)[1].direct
    for bad in ({"block_t": 32}, {"pdl": True}, {"prequant": False}):
        shape = entry(4)
        shape["buckets"].insert(1, {**direct, **bad})
        table = tiles.load_table(write(tmp_path, {"block:6144x4096": shape}))
        assert not table.shapes and "direct tile" in table.rejected[0]


def test_the_fewest_chunks_within_the_tolerance_are_chosen() -> None:
    """One chunk spares larger batches the chunk ends, so it wins when its batch-one time is close enough
    to the fastest; otherwise the fastest count stands. Failed cells count for nothing."""
    def cell(chunks: int, us: float | None) -> space.Cell:
        return space.Cell("block", "qkv", 1, chunks, Tile(64, 16, 4, 4), us=us)

    assert space.pick_chunks([cell(1, 10.2), cell(8, 10.0), cell(4, 10.1)]) == 1  # within 3%
    assert space.pick_chunks([cell(1, 11.0), cell(8, 10.0), cell(4, 10.25)]) == 4
    assert space.pick_chunks([cell(1, None), cell(8, 10.0)]) == 8
    assert space.pick_chunks([cell(8, None)]) is None
    for n, k in space.shapes_8b().values():  # one chunk is always timed
        assert space.chunk_choices(n, k, SMS)[0] == 1
