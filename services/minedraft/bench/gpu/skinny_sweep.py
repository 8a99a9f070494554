"""`python3 -m minedraft.bench.gpu.skinny_sweep`: the few-row Triton GEMM's configs against cuBLAS and cuBLASLt.

For each projection of the 8B shape and each row count, times every config of `engine/cuda/skinny_gemm.py`
that runs it next to both BLAS libraries, timed as the BLAS plan times them (`engine/blas_plan.gemm_ms`: a
CUDA graph of one call per rotating weight copy, 256 MB or more so L2 holds none of them), and checks each
config's output against a float32 product of the same bf16 operands (largest error relative to the output's
largest magnitude). Prints the best config per cell against the bound (the weight's bytes over the measured
copy bandwidth); `--out` writes every timing as JSON.

`gate_up+silu` and `qkv+rope` (the 8B shape's 32 query and 8 kv heads of 128) time the fused ops the BLAS
plan chooses among (`engine/blas_ops.py`): each library's GEMM followed by the separate kernel against every
config of the fused form (the K-split ones too where the form has them); their error is not checked here
(`tests/gpu/test_skinny_gemm.py` and `test_skinny_rope.py` check their bits against the separate kernels).
`--configs` narrows the Triton side to the configs whose names contain one of its comma-separated parts
(`--configs k2,k4`: the K-split ones).
"""

from __future__ import annotations

import sys

import torch
from torch.nn import functional as F

from minedraft.bench.gpu.blas_choice import SHAPES, rotating_weights, run_cli
from minedraft.bench.gpu.timing import ceilings


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest error of `y` against the float32 product `ref`, over `ref`'s largest magnitude."""
    return ((y.float() - ref).abs().max() / ref.abs().max()).item()


FUSED = {"gate_up+silu": ("gate_up", "glu"), "qkv+rope": ("qkv", "rope32x8x128")}  # name: (shape, plan op)


def fused_configs(op: str, m: int) -> list:
    """The configs of a fused op's form that run m rows (two weight tiles must fit; rope: tiles that divide half a
    128-wide head)."""
    from minedraft.engine.cuda.skinny_configs import SMEM, configs_for
    from minedraft.engine.cuda.skinny_rope import fits_heads

    fit = [c for c in configs_for(m) if c.staged_bytes(2, glu=True) <= SMEM]
    return fit if op == "glu" else [c for c in fit if fits_heads(c, 128)]


def chosen(configs: list, parts: tuple[str, ...]) -> list:
    """The configs whose names contain one of `parts` (all of them where there are none)."""
    return [c for c in configs if not parts or any(part in c.name for part in parts)]


def measure(ms: list[int], shapes: list[str], configs: str = "") -> dict:
    from minedraft.engine.blas_ops import prefix
    from minedraft.engine.blas_plan import TRITON, gemm_ms, set_library, triton_linear
    from minedraft.engine.cuda.skinny_configs import configs_for

    parts = tuple(part for part in configs.split(",") if part)
    copy = ceilings()["copy_GBps"]
    cells = []
    for name in shapes:
        shape, op = FUSED.get(name, (name, "linear"))
        n, k = SHAPES[shape]
        bytes_ = n * k * 2
        weights = rotating_weights(n, k)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = (x.float() @ weights[0].float().t())
            cell = {"gemm": name, "n": n, "k": k, "m": m, "bound_us": bytes_ / (copy * 1e3), "configs": {}}
            for lib in ("cublas", "cublaslt"):
                cell[f"{lib}_us"] = gemm_ms(prefix(op) + lib, m, weights) * 1e3
                set_library(lib)
                cell[f"{lib}_err"] = relative_error(F.linear(x, weights[0]), ref)
            set_library("cublas")
            for config in chosen(configs_for(m) if op == "linear" else fused_configs(op, m), parts):
                choice = TRITON + config.name
                err = relative_error(triton_linear(choice, x, weights[0], None), ref) if op == "linear" else None
                cell["configs"][config.name] = {"us": gemm_ms(prefix(op) + choice, m, weights) * 1e3, "err": err}
            if not cell["configs"]:
                raise SystemExit(f"no config of {name} at {m} rows matches --configs {','.join(parts)}")
            best = min(cell["configs"].items(), key=lambda kv: kv[1]["us"])
            blas = min(cell["cublas_us"], cell["cublaslt_us"])
            cell["best"] = best[0]
            print(f"{name:>8} M={m:>3}: bound {cell['bound_us']:6.1f} us | cublas {cell['cublas_us']:6.1f} "
                  f"| cublaslt {cell['cublaslt_us']:6.1f} | triton {best[1]['us']:6.1f} ({best[0]}, err "
                  f"{'-' if best[1]['err'] is None else format(best[1]['err'], '.1e')} vs cublas "
                  f"{cell['cublas_err']:.1e}) | triton / best BLAS "
                  f"{best[1]['us'] / blas:.3f} | bound / triton {cell['bound_us'] / best[1]['us']:.1%}", flush=True)
            cells.append(cell)
        del weights
        torch.cuda.empty_cache()
    return {"copy_GBps": copy, "device": torch.cuda.get_device_name(), "cells": cells}


def main(argv: list[str] | None = None) -> int:
    return run_cli("minedraft.bench.gpu.skinny_sweep", __doc__, measure, "1,5,16,32,64", "qkv,o,gate_up,down", argv,
                   {"configs": "comma list: time only the Triton configs whose names contain one of these"})


if __name__ == "__main__":
    sys.exit(main())
