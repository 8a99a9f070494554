"""`python -m minedraft.bench.gpu.fp8_probe OUT.json`: FP8 against bf16 on the synthetic 8B target.

Prints and writes (1) each projection GEMM of the 8B shape at M = 1, 16, 64 (and a prefill M):
the FP8 kernel's time, its bandwidth bound (weight bytes over the copy bandwidth) and bf16
`F.linear`'s time, plus whether every row's bits match across M; (2) the AR decode step at batch
1, 16 and 64 for the bf16 target and for the same target quantized (`bench/fp8_quantizer.py`),
as CUDA-event GPU time of a step (CUDA-graph replay) and as the whole step seen by the host.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.nn import functional as F

from minedraft.bench.fp8_quantizer import quantize_model, quantize_weight
from minedraft.bench.gpu.timing import ceilings, log, time_cuda
from minedraft.bench.synthetic_pair import SHAPES, SyntheticSpec, build_synthetic
from minedraft.engine.fp8_weights import Fp8Weight
from minedraft.engine.runner import ModelRunner

GEMM_REPEATS = 20  # launches per CUDA graph timed, so no host launch cost is in a GEMM's time


def gemm_shapes() -> dict[str, tuple[int, int]]:
    cfg = SHAPES["llama3-8b"]
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    return {"qkv": (qkv, cfg.hidden_size), "o": (cfg.hidden_size, cfg.num_heads * cfg.head_dim),
            "gate_up": (2 * cfg.intermediate_size, cfg.hidden_size), "down": (cfg.hidden_size, cfg.intermediate_size)}


def graphed_seconds(fn) -> float:
    """GPU seconds of one fn() from a replayed CUDA graph of GEMM_REPEATS calls."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GEMM_REPEATS):
            fn()
    return time_cuda(graph.replay) / GEMM_REPEATS


def gemm_table(scheme: str, copy_bps: float, ms: list[int]) -> list[dict]:
    from minedraft.engine.cuda.fp8_gemm import fp8_gemm

    rows = []
    for name, (n, k) in gemm_shapes().items():
        dense = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
        q, scale = quantize_weight(dense, scheme)
        weight = Fp8Weight(q, scale, scheme, 128 if scheme == "block" else 1)
        x_all = torch.randn(max(ms), k, device="cuda", dtype=torch.bfloat16)
        full = fp8_gemm(x_all, weight)
        for m in ms:
            x = x_all[-m:]
            fp8_s = graphed_seconds(lambda x=x, w=weight: fp8_gemm(x, w))
            bf16_s = graphed_seconds(lambda x=x, d=dense: F.linear(x, d))
            fp8_bytes = n * k + scale.numel() * 4 + m * (k + n) * 2
            rows.append({"gemm": name, "n": n, "k": k, "m": m, "fp8_us": fp8_s * 1e6, "bf16_us": bf16_s * 1e6,
                         "fp8_bound_us": fp8_bytes / copy_bps * 1e6, "fp8_over_bound": fp8_s * copy_bps / fp8_bytes,
                         "fp8_over_bf16": fp8_s / bf16_s, "rows_m_independent": bool(torch.equal(
                             fp8_gemm(x, weight), full[-m:]))})
            r = rows[-1]
            log(f"{scheme} {name} m={m}: fp8 {r['fp8_us']:.1f} us (bound {r['fp8_bound_us']:.1f}, "
                f"x{r['fp8_over_bound']:.2f}), bf16 {r['bf16_us']:.1f} us, fp8/bf16 {r['fp8_over_bf16']:.2f}, "
                f"M-independent {r['rows_m_independent']}")
    return rows


def decode_steps(model, batches: list[int], context: int) -> dict[int, dict[str, float]]:
    """Per batch size: GPU time of one decode step (CUDA-graph replay) and its host wall time."""
    blocks = sum(batches) * ((context + 64) // 16 + 2)
    runner = ModelRunner(model, blocks, 16, "cuda:0")
    out: dict[int, dict[str, float]] = {}
    seq = 0
    for b in batches:
        ids = list(range(seq, seq + b))
        seq += b
        runner.forward(ids, [list(range(3, 3 + context))] * b, [0] * b, last_n=1)
        token = torch.full((b, 1), 5, device="cuda:0")

        def step(ids=ids, token=token, b=b) -> None:
            runner.forward_ids(ids, token, [context] * b, [1] * b, last_n=1)

        gpu_s = time_cuda(step, repeats=30)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(30):
            step()
        torch.cuda.synchronize()
        out[b] = {"gpu_ms": gpu_s * 1e3, "wall_ms": (time.perf_counter() - start) / 30 * 1e3}
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
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    ceiling = ceilings()
    copy_bps = ceiling["copy_GBps"] * 1e9  # read + write bytes over the copy's time: a stream's rate
    log(f"copy {ceiling['copy_GBps']:.0f} GB/s (read+write), bf16 {ceiling['bf16_TFLOPs']:.0f} TFLOP/s")
    results: dict[str, object] = {"ceilings": ceiling, "scheme": args.scheme}
    results["gemms"] = gemm_table(args.scheme, copy_bps, [*batches, 2048])
    if not args.gemm_only:
        model = build_synthetic(SyntheticSpec.parse("synthetic:llama3-8b:target"), "cuda:0", torch.bfloat16)
        bf16 = decode_steps(model, batches, args.context)
        quantize_model(model, args.scheme)
        torch.cuda.empty_cache()
        fp8 = decode_steps(model, batches, args.context)
        results["decode"] = {str(b): {"bf16": bf16[b], "fp8": fp8[b],
                                      "gpu_ratio": fp8[b]["gpu_ms"] / bf16[b]["gpu_ms"],
                                      "wall_ratio": fp8[b]["wall_ms"] / bf16[b]["wall_ms"]} for b in batches}
        for b in batches:
            d = results["decode"][str(b)]  # type: ignore[index]
            log(f"decode b={b}: bf16 {bf16[b]['gpu_ms']:.3f} ms GPU / {bf16[b]['wall_ms']:.3f} wall, fp8 "
                f"{fp8[b]['gpu_ms']:.3f} / {fp8[b]['wall_ms']:.3f}, ratio {d['gpu_ratio']:.3f} / {d['wall_ratio']:.3f}")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
