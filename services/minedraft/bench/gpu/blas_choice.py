"""`python3 -m minedraft.bench.gpu.blas_choice`: the 8B shape's bf16 projections under cuBLAS and cuBLASLt.

torch runs `F.linear` through cuBLAS unless `torch.backends.cuda.preferred_blas_library("cublaslt")` says
otherwise; the two pick kernels by their own heuristics, and at decode sizes cuBLAS splits K with a second
reduction kernel per GEMM. Per projection and token count this times one `F.linear` of each library side by
side (a CUDA graph of `reps` launches over rotating weight copies, 256 MB or more, so L2 holds none of them,
divided by `reps`), counts the kernels one call launches (torch.profiler), and gives the copy bound (the
weight's bytes over the measured device-to-device copy bandwidth). Prints a table; `--out` writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

from minedraft.bench.gpu.timing import ceilings

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
LIBRARIES = ("cublas", "cublaslt")


def graph_us(weights: list[torch.Tensor], x: torch.Tensor, library: str, rounds: int = 5) -> float:
    """Median over rounds of one launch's microseconds, in a graph of one F.linear per weight copy."""
    torch.backends.cuda.preferred_blas_library(library)
    outs = [F.linear(x, w) for w in weights]  # warm-up: the library's handles and workspaces

    def run() -> None:
        for w, out in zip(weights, outs, strict=True):
            torch.mm(x, w.t(), out=out)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / len(weights))
    return sorted(times)[len(times) // 2]


def kernels_per_call(weight: torch.Tensor, x: torch.Tensor, library: str) -> int:
    torch.backends.cuda.preferred_blas_library(library)
    F.linear(x, weight)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        F.linear(x, weight)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def rotating_weights(n: int, k: int) -> list[torch.Tensor]:
    """bf16 copies of an [n, k] weight, 256 MB or more in all (2-32 of them), so L2 holds none while they rotate."""
    copies = max(2, min(32, -(-(256 << 20) // (n * k * 2))))
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]


def measure(ms: list[int], shapes: list[str]) -> dict:
    copy = ceilings()["copy_GBps"]
    rows = []
    for name in shapes:
        n, k = SHAPES[name]
        bytes_ = n * k * 2
        weights = rotating_weights(n, k)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            row = {"gemm": name, "n": n, "k": k, "m": m, "bound_us": bytes_ / (copy * 1e3)}
            outs = {}
            for lib in LIBRARIES:
                row[f"{lib}_us"] = graph_us(weights, x, lib)
                row[f"{lib}_kernels"] = kernels_per_call(weights[0], x, lib)
                outs[lib] = F.linear(x, weights[0])
            row["same_bits"] = bool(torch.equal(outs["cublas"], outs["cublaslt"]))
            rows.append(row)
            print(f"{name:>8} M={m:>4}: bound {row['bound_us']:7.1f} us | cublas {row['cublas_us']:7.1f} us "
                  f"({row['cublas_kernels']} kernels) | cublaslt {row['cublaslt_us']:7.1f} us "
                  f"({row['cublaslt_kernels']} kernels) | lt/cublas {row['cublaslt_us'] / row['cublas_us']:.3f} "
                  f"| same bits {row['same_bits']}", flush=True)
        del weights
        torch.cuda.empty_cache()
    torch.backends.cuda.preferred_blas_library("cublas")
    return {"copy_GBps": copy, "rows": rows}


def run_cli(prog: str, doc: str | None, measure_fn: Callable[..., dict], ms: str, shapes: str,
            argv: list[str] | None, options: dict[str, str] | None = None) -> int:
    """The command line of a per-projection GEMM timing: row counts, projections, an optional JSON file, and
    `options` (name: help) of the timing's own, strings passed to `measure_fn` by name."""
    p = argparse.ArgumentParser(prog=f"python3 -m {prog}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", default=ms, help="token counts (GEMM rows)")
    p.add_argument("--shapes", default=shapes, help=f"projections, of {', '.join(SHAPES)}")
    p.add_argument("--out", default="")
    for name, text in (options or {}).items():
        p.add_argument(f"--{name}", default="", help=text)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    extra = {name: getattr(args, name) for name in options or {}}
    results = measure_fn([int(m) for m in args.ms.split(",")], args.shapes.split(","), **extra)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli("minedraft.bench.gpu.blas_choice", __doc__, measure, "1,16,64,320", ",".join(SHAPES), argv)


if __name__ == "__main__":
    sys.exit(main())
