"""`python -m minedraft.bench.gpu.fp8_probe OUT.json`: FP8 against bf16 on the synthetic 8B target.

Prints and writes (1) each projection GEMM of the 8B shape at the decode batches and a prefill M,
with the active tile table (`MINEDRAFT_FP8_TILES` or the committed one): the FP8 kernel's GPU time
(CUDA-graph replays over rotating weight copies, `fp8_tune.graph_us`), its bandwidth bound (bytes
over the copy bandwidth) and bf16 `F.linear`'s time, plus whether every row's bits match across M;
(2) the AR decode step at batch 1, 16 and 64 for the bf16 target and for the same target quantized
(`bench/fp8_quantizer.py`): GPU time (steps queued behind a sleeping kernel, so the host is ahead;
`host_ahead` says whether it was) and the whole step seen by the host. Past `--deadline` seconds
the remaining cells are skipped and listed under "skipped".
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.nn import functional as F

from minedraft.bench.fp8_quantizer import quantize_model
from minedraft.bench.gpu.blocked_gpu import sleep_cycles
from minedraft.bench.gpu.fp8_space import shapes_8b
from minedraft.bench.gpu.fp8_tune import fp8_bytes, graph_us, rotated_weights
from minedraft.bench.gpu.timing import ceilings, log
from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic
from minedraft.engine.runner import ModelRunner

STEPS = 20  # decode steps per timed run


def gemm_shapes() -> dict[str, tuple[int, int]]:
    return shapes_8b()


def gemm_table(scheme: str, copy_bps: float, ms: list[int], deadline: float, skipped: list[str]) -> list[dict]:
    from minedraft.engine.cuda.fp8_gemm import fp8_gemm

    rows = []
    for name, (n, k) in gemm_shapes().items():
        if time.monotonic() > deadline:
            skipped.append(f"gemm {scheme} {name}")
            continue
        weights, dense = rotated_weights(n, k, scheme)
        x_all = torch.randn(max(ms), k, device="cuda", dtype=torch.bfloat16)
        full = fp8_gemm(x_all, weights[0])
        for m in ms:
            x = x_all[-m:]
            fp8_us = graph_us([lambda x=x, w=w: fp8_gemm(x, w) for w in weights])
            bf16_us = graph_us([lambda x=x, d=d: F.linear(x, d) for d in dense])
            bound_us = fp8_bytes(n, k, m, scheme) / copy_bps * 1e6
            rows.append({"gemm": name, "n": n, "k": k, "m": m, "fp8_us": fp8_us, "bf16_us": bf16_us,
                         "fp8_bound_us": bound_us, "fp8_over_bound": fp8_us / bound_us,
                         "fp8_over_bf16": fp8_us / bf16_us,
                         "rows_m_independent": bool(torch.equal(fp8_gemm(x, weights[0]), full[-m:]))})
            r = rows[-1]
            log(f"{scheme} {name} m={m}: fp8 {fp8_us:.1f} us (bound {bound_us:.1f}, x{r['fp8_over_bound']:.2f}), "
                f"bf16 {bf16_us:.1f} us, fp8/bf16 {r['fp8_over_bf16']:.2f}, M-independent {r['rows_m_independent']}")
        del weights, dense
        torch.cuda.empty_cache()
    return rows


def queued_gpu_ms(step, cycles: int) -> tuple[float, bool]:
    """GPU milliseconds per step of STEPS steps queued behind a sleeping kernel, and whether the host
    had queued them all before the GPU reached the first (else host gaps are in the time)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)
    start.record()
    for _ in range(STEPS):
        step()
    end.record()
    ahead = not start.query()
    end.synchronize()
    return start.elapsed_time(end) / STEPS, ahead


def decode_steps(model, batches: list[int], context: int, deadline: float, skipped: list[str],
                 label: str) -> dict[int, dict[str, float]]:
    """Per batch size: GPU time of one decode step (the runner's CUDA graph, queued behind a sleep) and
    the host's wall time per step."""
    blocks = sum(batches) * ((context + 64) // 16 + 2)
    runner = ModelRunner(model, blocks, 16, "cuda:0")
    cycles = sleep_cycles(200.0)  # a sleep the host can outrun
    out: dict[int, dict[str, float]] = {}
    seq = 0
    for b in batches:
        if time.monotonic() > deadline:
            skipped.append(f"decode {label} b={b}")
            continue
        ids = list(range(seq, seq + b))
        seq += b
        runner.forward(ids, [list(range(3, 3 + context))] * b, [0] * b, last_n=1)
        token = torch.full((b, 1), 5, device="cuda:0")

        def step(ids=ids, token=token, b=b) -> None:
            runner.forward_ids(ids, token, [context] * b, [1] * b, last_n=1)

        for _ in range(3):  # capture and warm the graph
            step()
        torch.cuda.synchronize()
        gpu_ms, ahead = queued_gpu_ms(step, cycles)
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
        out[b] = {"gpu_ms": gpu_ms, "host_ahead": ahead, "wall_ms": (time.perf_counter() - start) / STEPS * 1e3}
        for i in ids:
            runner.free(i)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m minedraft.bench.gpu.fp8_probe", description=__doc__)
    p.add_argument("out", help="JSON results path")
    p.add_argument("--scheme", choices=("block", "channel"), default="block")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--gemm-only", action="store_true")
    p.add_argument("--decode-first", action="store_true", help="the decode steps before the GEMM table")
    p.add_argument("--deadline", type=float, default=1e9, help="seconds from start; later cells are skipped")
    args = p.parse_args(argv)
    from minedraft.engine.cuda.fp8_tiles import active_table

    deadline = time.monotonic() + args.deadline
    batches = [int(b) for b in args.batches.split(",")]
    ceiling = ceilings()
    copy_bps = ceiling["copy_GBps"] * 1e9  # read + write bytes over the copy's time: a stream's rate
    table = active_table()
    log(f"copy {ceiling['copy_GBps']:.0f} GB/s (read+write), bf16 {ceiling['bf16_TFLOPs']:.0f} TFLOP/s; "
        f"tiles from {table.source} ({len(table.shapes)} shapes)")
    skipped: list[str] = []
    results: dict[str, object] = {"ceilings": ceiling, "scheme": args.scheme, "tiles": table.source,
                                  "skipped": skipped}

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)

    def gemms() -> None:
        results["gemms"] = gemm_table(args.scheme, copy_bps, [*batches, 2048], deadline, skipped)
        save()

    if args.decode_first or args.gemm_only:
        pass
    else:
        gemms()
    if not args.gemm_only:
        model = build_synthetic(SyntheticSpec.parse("synthetic:llama3-8b:target"), "cuda:0", torch.bfloat16)
        bf16 = decode_steps(model, batches, args.context, deadline, skipped, "bf16")
        quantize_model(model, args.scheme)
        torch.cuda.empty_cache()
        fp8 = decode_steps(model, batches, args.context, deadline, skipped, "fp8")
        del model
        torch.cuda.empty_cache()
        results["decode"] = {str(b): {"bf16": bf16[b], "fp8": fp8[b],
                                      "gpu_ratio": fp8[b]["gpu_ms"] / bf16[b]["gpu_ms"],
                                      "wall_ratio": fp8[b]["wall_ms"] / bf16[b]["wall_ms"]}
                             for b in batches if b in bf16 and b in fp8}
        save()
        for b, d in results["decode"].items():  # type: ignore[attr-defined]
            log(f"decode b={b}: bf16 {d['bf16']['gpu_ms']:.3f} ms GPU / {d['bf16']['wall_ms']:.3f} wall, fp8 "
                f"{d['fp8']['gpu_ms']:.3f} / {d['fp8']['wall_ms']:.3f}, ratio {d['gpu_ratio']:.3f} / "
                f"{d['wall_ratio']:.3f} (host ahead: {d['bf16']['host_ahead']}, {d['fp8']['host_ahead']})")
    if args.decode_first or args.gemm_only:
        gemms()
    if skipped:
        log(f"skipped past the deadline: {', '.join(skipped)}")
    save()


if __name__ == "__main__":
    main()
