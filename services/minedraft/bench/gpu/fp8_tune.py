"""`python -m minedraft.bench.gpu.fp8_tune OUTDIR [--deadline S]`: tune the FP8 GEMM's tiles on this GPU.

For the 8B projection shapes and both schemes: pick the chunk count (one per shape: it fixes the
summation order) from batch-1 timings (the fewest within 3% of the fastest, `fp8_space.pick_chunks`),
then per M bucket the fastest tile and K-split, each timed as GPU time from CUDA-graph replays of many
back-to-back GEMMs over rotating weight copies (more bytes than the L2 holds), beside bf16 `F.linear`
and the bandwidth bound (bytes over the measured copy rate). Before the table is written, every row of
every tuned shape must have the same bits at every M of `CHECK_MS` as at M = 2048 (shapes kept from the
base table too); a shape that fails takes the default and is reported. Writes OUTDIR/fp8_tiles.json (the
format `engine/cuda/fp8_tiles.py` reads) and fp8_tune.json/.md. Shapes of schemes not tuned, and shapes
past the deadline, keep the base table's entry (`--base`, the committed table by default); buckets past
it keep the base table's tile where the chunk count is the same, else the default (the table says
which).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

from minedraft.bench.gpu import fp8_space as space
from minedraft.bench.gpu.fp8_space import Cell
from minedraft.engine.cuda.fp8_tiles import (
    COMMITTED,
    Bucket,
    ShapeTiles,
    Tile,
    TileTable,
    choose,
    default_tile,
    load_table,
    shape_key,
)
from minedraft.engine.fp8_weights import Fp8Weight

ROTATE_BYTES = 256 << 20  # weight bytes cycled through per timed graph: several times the H200's 50 MB L2
DEVICE = "cuda"  # the smoke test on a CPU sets "cpu" (Triton's interpreter)
CHECK_SECONDS = 12.0  # kept back from the deadline for the bit-identity check and the writing


def rotated_weights(n: int, k: int, scheme: str, seed: int = 0) -> tuple[list[Fp8Weight], list[torch.Tensor]]:
    """FP8 copies and bf16 copies of one random weight, enough of each to stream ROTATE_BYTES."""
    from minedraft.bench.fp8_quantizer import quantize_weight

    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    dense = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16, generator=gen) * k**-0.5
    q, scale = quantize_weight(dense, scheme)
    rows = 128 if scheme == "block" else 1
    fp8 = [Fp8Weight(q if i == 0 else q.clone(), scale.clone(), scheme, rows)
           for i in range(max(2, -(-ROTATE_BYTES // (n * k))))]
    bf16 = [dense if i == 0 else dense.clone() for i in range(max(2, -(-ROTATE_BYTES // (2 * n * k))))]
    return fp8, bf16


def graph_us(calls: list[Callable[[], object]], min_launches: int = 8, target_us: float = 2000.0) -> float:
    """GPU microseconds per call: CUDA graphs of back-to-back calls (cycling through `calls`), replayed
    and timed with CUDA events; the median of five replays."""
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for fn in calls:
        fn()
    end.record()
    end.synchronize()
    rough = max(start.elapsed_time(end) * 1e3 / len(calls), 1.0)  # host-bound: an upper bound
    launches = max(min_launches, len(calls), min(400, int(target_us / rough)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            calls[i % len(calls)]()
    graph.replay()
    samples = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / launches)
    del graph
    return sorted(samples)[2]


def fp8_bytes(n: int, k: int, m: int, scheme: str) -> int:
    scales = -(-n // 128) * -(-k // 128) if scheme == "block" else n
    return n * k + 4 * scales + 2 * m * (k + n)


def time_cell(cell: Cell, weights: list[Fp8Weight], x: torch.Tensor) -> Cell:
    from minedraft.engine.cuda.fp8_gemm import fp8_gemm_with

    try:
        cell.us = graph_us([lambda w=w: fp8_gemm_with(x, w, cell.chunks, cell.tile) for w in weights])
    except Exception as exc:  # a tile this GPU cannot run (shared memory, registers): not a candidate
        cell.error = f"{type(exc).__name__}: {str(exc)[:200]}"
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return cell


def kept_tile(base: TileTable, scheme: str, n: int, k: int, m: int, chunks: int, sms: int) -> Tile:
    """An untimed bucket's tile: the base table's, where it has the shape with the same chunk count,
    else the default."""
    entry = base.shape(scheme, n, k)
    if entry is not None and entry.chunks == chunks:
        return entry.tile(m)
    return default_tile(scheme, n, m, chunks, sms)


def tune_shape(scheme: str, gemm: str, n: int, k: int, sms: int, deadline: float, base: TileTable,
               cells: list[Cell], min_m: int = 1) -> tuple[ShapeTiles, list[dict]]:
    """The shape's chunk count and per-bucket tiles, and one summary row per bucket. M = 1 times the
    whole decode space for each chunk count; M up to DECODE_M only the fastest of those. With min_m > 1
    and the shape in the base table, its chunk count and the tiles of buckets below min_m are kept (each
    kept tile timed once, for the table)."""
    weights, dense = rotated_weights(n, k, scheme)
    x_all = torch.randn(max(space.M_BUCKETS), k, device=DEVICE, dtype=torch.bfloat16)

    def sweep(m: int, tiles: list[tuple[int, Tile]]) -> list[Cell]:
        tried = [time_cell(Cell(scheme, gemm, m, chunks, tile), weights, x_all[:m])
                 for chunks, tile in tiles if time.monotonic() < deadline]
        cells.extend(tried)
        return tried

    kept = base.shape(scheme, n, k) if min_m > 1 else None
    if kept is not None:
        chunks, decode, top = kept.chunks, [], None
    else:
        min_m = 1
        choices = space.chunk_choices(n, k, sms)
        first = sweep(1, [(c, st) for c in choices
                          for t in space.tiles_for(scheme, 1) for st in space.split_tiles(c, t, n, 1, sms)])
        picked = space.pick_chunks(first)
        chunks = picked if picked is not None else next((c for c in choices if c > 1), 1)
        decode = space.fastest([c for c in first if c.chunks == chunks], space.RETIME)
        top = decode[0] if decode else None
    buckets, rows = [], []
    for m in space.M_BUCKETS:
        tried: list[Cell] = []
        if m < min_m:
            tried = sweep(m, [(chunks, kept_tile(base, scheme, n, k, m, chunks, sms))])
            top = None
        elif m > 1:
            tiles = ([(chunks, c.tile) for c in decode] if m <= space.DECODE_M else
                     [(chunks, st) for t in space.tiles_for(scheme, m)
                      for st in space.split_tiles(chunks, t, n, m, sms)])
            tried = sweep(m, tiles)
            top = space.best(tried)
        tile = top.tile if top is not None else kept_tile(base, scheme, n, k, m, chunks, sms)
        buckets.append(Bucket(m, tile))
        bf16_us = graph_us([lambda d=d, x=x_all[:m]: F.linear(x, d) for d in dense])
        by_form = {form: space.best([c for c in tried if c.tile.direct == (form == "direct")])
                   for form in ("transposed", "direct")}
        timed = top if top is not None else space.best(tried)
        rows.append({"scheme": scheme, "gemm": gemm, "n": n, "k": k, "m": m, "chunks": chunks, "tile": tile,
                     "tuned": top is not None, "kept": m < min_m, "fp8_us": timed.us if timed is not None else None,
                     "bf16_us": bf16_us, "bytes": fp8_bytes(n, k, m, scheme),
                     **{f"{form}_us": c.us if c is not None else None for form, c in by_form.items()}})
    weights.clear()
    dense.clear()
    torch.cuda.empty_cache()
    return ShapeTiles(chunks, tuple(buckets)), rows


def rows_m_independent(table: TileTable, scheme: str, n: int, k: int, sms: int) -> list[int]:
    """The Ms of CHECK_MS at which some row's bits differ from the same row's at M = 2048 (random data
    with heavy-tailed activations; the rows sit at other indices at each M)."""
    from minedraft.engine.cuda.fp8_gemm import fp8_gemm_with

    weights, _ = rotated_weights(n, k, scheme, seed=7)
    w = weights[0]
    gen = torch.Generator(device=DEVICE).manual_seed(11)
    x = torch.randn(max(space.CHECK_MS), k, device=DEVICE, generator=gen)
    x = (x * torch.exp(torch.randn(k, device=DEVICE, generator=gen))).to(torch.bfloat16)

    def run(rows: torch.Tensor) -> torch.Tensor:
        chunks, tile = choose(table, scheme, n, k, rows.shape[0], sms)
        return fp8_gemm_with(rows, w, chunks, tile)

    full = run(x)
    return [m for m in space.CHECK_MS if not torch.equal(run(x[-m:]), full[-m:])]


def markdown(rows: list[dict], copy_bps: float, checks: dict[str, object]) -> str:
    lines = ["| scheme | gemm | M | chunks | tile (n x t, warps, stages, split, prequant, fused, tma, direct) | "
             "fp8 us | transposed / direct us | bound us | fp8/bound | bf16 us | fp8/bf16 |", "|" + " --- |" * 11]

    def us(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    for r in rows:
        t: Tile = r["tile"]
        bound = r["bytes"] / copy_bps * 1e6
        fp8 = r["fp8_us"]
        kept = "" if r["tuned"] else " (kept)" if r.get("kept") else " (kept: out of time)"
        forms = f"{us(r.get('transposed_us'))} / {us(r.get('direct_us'))}"
        shape = ", ".join(str(v) for v in (f"{t.block_n}x{t.block_t}", t.warps, t.stages, t.split, t.prequant,
                                           t.fused, t.tma, t.direct))
        lines.append(f"| {r['scheme']} | {r['gemm']} | {r['m']} | {r['chunks']} | {shape}{kept} | {us(fp8)} | "
                     f"{forms} | "
                     + (f"{bound:.1f} | {fp8 / bound:.2f} | {r['bf16_us']:.1f} | {fp8 / r['bf16_us']:.2f} |"
                        if fp8 is not None else f"{bound:.1f} | - | {r['bf16_us']:.1f} | - |"))
    lines += ["", "Rows bit-identical across M (chosen table): "
              + ", ".join(f"{key}: {v}" for key, v in checks.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minedraft.bench.gpu.fp8_tune", description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--deadline", type=float, default=90.0, help="seconds from start for the whole run")
    p.add_argument("--schemes", default="block,channel")
    p.add_argument("--workers", type=int, default=12, help="processes compiling kernels ahead (0: none)")
    p.add_argument("--min-m", type=int, default=1,
                   help="time only the buckets from this M up; smaller ones keep the base table's chunks and tiles")
    p.add_argument("--base", type=Path, default=COMMITTED,
                   help="table whose entries serve the shapes and buckets not timed here (default: the committed one)")
    args = p.parse_args(argv)
    from minedraft.bench.gpu.fp8_compile import precompile
    from minedraft.bench.gpu.timing import ceilings, log
    from minedraft.engine.cuda.fp8_tiles import to_json

    t0 = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    schemes = args.schemes.split(",")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    compiled = precompile(schemes, sms, args.workers, t0 + args.deadline * 0.4, args.min_m)
    log(f"precompiled {compiled} kernels in {time.monotonic() - t0:.0f} s")
    ceiling = ceilings()
    copy_bps = ceiling["copy_GBps"] * 1e9
    tune_deadline = t0 + args.deadline - CHECK_SECONDS
    base = load_table(args.base)
    shapes: dict[str, ShapeTiles] = dict(base.shapes)  # replaced below by what is tuned
    rows: list[dict] = []
    cells: list[Cell] = []
    for scheme in schemes:
        for gemm, (n, k) in space.shapes_8b().items():
            if time.monotonic() > tune_deadline:
                log(f"out of time: {scheme} {gemm} keeps {base.source if base.shape(scheme, n, k) else 'the default'}")
                continue
            shapes[shape_key(scheme, n, k)], shape_rows = tune_shape(scheme, gemm, n, k, sms, tune_deadline, base,
                                                                     cells, args.min_m)
            rows += shape_rows
            log(f"{scheme} {gemm}: chunks {shape_rows[0]['chunks']}, " + ", ".join(
                f"m={r['m']} {r['fp8_us']:.1f}/{r['bf16_us']:.1f}us" for r in shape_rows if r["fp8_us"]))
    checks: dict[str, object] = {}
    for key in list(shapes):
        scheme, nk = key.split(":")
        n, k = map(int, nk.split("x"))
        bad = rows_m_independent(TileTable(shapes, "tuned"), scheme, n, k, sms)
        checks[key] = "yes" if not bad else f"NO at M={bad}: dropped, the default serves"
        if bad:
            del shapes[key]
            again = rows_m_independent(TileTable({}, "default"), scheme, n, k, sms)
            checks[key] = f"{checks[key]} (default: {'yes' if not again else f'NO at M={again}'})"
        log(f"bit identity {key}: {checks[key]}")
    name = torch.cuda.get_device_name(0)
    notes = {"copy_GBps": ceiling["copy_GBps"], "checks": checks, "seconds": time.monotonic() - t0,
             "untuned_buckets": [f"{r['scheme']}:{r['gemm']}:m{r['m']}" for r in rows
                                 if not r["tuned"] and not r["kept"]],
             "kept_below_m": args.min_m}
    (args.out / "fp8_tiles.json").write_text(json.dumps(to_json(shapes, name, sms, notes), indent=1) + "\n")
    plain = [{**r, "tile": r["tile"].__repr__()} for r in rows]
    timed = [{"scheme": c.scheme, "gemm": c.gemm, "m": c.m, "chunks": c.chunks, "tile": repr(c.tile), "us": c.us,
              "error": c.error} for c in cells]
    (args.out / "fp8_tune.json").write_text(json.dumps({"ceilings": ceiling, "rows": plain, "cells": timed,
                                                        "checks": checks, "notes": notes}, indent=1))
    table = markdown(rows, copy_bps, checks)
    (args.out / "fp8_tune.md").write_text(table)
    print(table, flush=True)
    log(f"tuned {len(shapes)} shapes, {len(cells)} cells in {time.monotonic() - t0:.0f} s")
    return 0 if all(v == "yes" for v in checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
