"""`python3 -m minedraft.bench.gpu.gemv_probe OUT.json`: the decode GEMV (engine/cuda/bf16_gemv.py) against
cuBLAS, per projection and in the whole AR step, side by side in one process.

1. Each 8B projection at M = 1, 4, 16: cuBLAS `F.linear` (with the norm or activation kernel before it where
   the layer has one) against the GEMV with that step folded in, for the default plan and a few others;
   CUDA-graph replays over rotating weights (past the L2), beside the bandwidth bound.
2. The synthetic 8B target's AR decode step with the GEMV path off and on (two runners over one model, each
   with its CUDA graphs), GPU ms of steps queued behind a sleeping kernel, alternating rounds; and the greedy
   tokens of both over the same steps, which must agree.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

from minedraft.bench.gpu.fp8_tune import graph_us
from minedraft.bench.gpu.step_cells import BlockedGpu
from minedraft.bench.gpu.timing import ceilings, log
from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic
from minedraft.engine.cuda.bf16_gemv import gemv, plan
from minedraft.engine.cuda.fused_kernels import add_rms_norm_triton, silu_mul_triton
from minedraft.engine.runner import ModelRunner

SHAPES = {"qkv": (6144, 4096, "norm"), "o": (4096, 4096, "plain"), "gate_up": (28672, 4096, "norm"),
          "down": (4096, 14336, "silu")}
ROTATE_BYTES = 256 << 20


def alternatives(n: int, k: int, sms: int) -> list[tuple[int, int, int, int, int]]:
    """The default plan first, then tiles of 32-128 rows and 128-256 columns with K splits that keep
    between one and eight programs per multiprocessor."""
    base = plan(n, k, sms)
    out = {base}
    for block_k in (128, 256):
        blocks = -(-k // block_k)
        for block_n in (32, 64, 128):
            tiles = -(-n // block_n)
            for split in (s for s in range(1, 17) if blocks % s == 0 and sms <= tiles * s <= 8 * sms):
                out.add((block_n, block_k, split, 4, 3 if block_n * block_k >= 128 * 256 else 4))
    return sorted(out, key=lambda c: (c != base, c))


def projection_rows(copy_gbps: float, ms: list[int], sms: int, most: int) -> list[dict]:
    rows = []
    for name, (n, k, prologue) in SHAPES.items():
        copies = max(2, -(-ROTATE_BYTES // (2 * n * k)))
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(copies)]
        norm_w = torch.ones(k, device="cuda", dtype=torch.bfloat16)
        for m in ms:
            x = torch.randn(m, 2 * k if prologue == "silu" else k, device="cuda", dtype=torch.bfloat16)
            res = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)

            inputs = (x, res, norm_w, prologue)

            row = {"gemm": name, "n": n, "k": k, "m": m, "prologue": prologue,
                   "bound_us": (2 * n * k + 2 * m * (n + k)) / copy_gbps / 1e3,
                   "cublas_us": graph_us([functools.partial(_cublas, inputs, w) for w in weights]), "configs": []}
            for cfg in alternatives(n, k, sms)[:most]:
                try:
                    us = graph_us([functools.partial(_ours, inputs, w, cfg) for w in weights])
                except Exception as exc:  # a config this GPU cannot run is no candidate
                    torch.cuda.synchronize()
                    row["configs"].append({"config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:120]}"})
                    continue
                row["configs"].append({"config": cfg, "us": us})
            timed = [c for c in row["configs"] if "us" in c]
            row["plan_us"] = timed[0]["us"] if timed and timed[0]["config"] == plan(n, k, sms) else None
            row["best"] = min(timed, key=lambda c: c["us"]) if timed else None
            rows.append(row)
            best = row["best"]["us"] if row["best"] else float("nan")
            log(f"{name} m={m}: cuBLAS {row['cublas_us']:.1f} us, GEMV plan {row['plan_us']} best {best:.1f} "
                f"{row['best']['config'] if row['best'] else ''}, bound {row['bound_us']:.1f}")
        del weights
        torch.cuda.empty_cache()
    return rows


Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]  # x, residual, norm weight, prologue


def _cublas(inputs: Inputs, w: torch.Tensor) -> object:
    """The unfused layer step: the norm or activation kernel, then cuBLAS."""
    x, res, norm_w, prologue = inputs
    if prologue == "norm":
        return F.linear(add_rms_norm_triton(x, res, norm_w, 1e-5)[0], w)
    return F.linear(silu_mul_triton(x) if prologue == "silu" else x, w)


def _ours(inputs: Inputs, w: torch.Tensor, cfg: tuple[int, int, int, int, int]) -> object:
    x, res, norm_w, prologue = inputs
    if prologue == "norm":
        return gemv(x, w, residual=res, norm=(norm_w, 1e-5), config=cfg)
    return gemv(x, w, silu=prologue == "silu", config=cfg)


def decode_rows(batches: list[int], context: int, rounds: int, steps: int) -> list[dict]:
    # The peaked head (greedy margins far above bf16 rounding), so the two paths' tokens must agree.
    model = build_synthetic(SyntheticSpec("llama3-8b", "target", draft_layers=4, agree=0.8623), "cuda:0",
                            torch.bfloat16)
    blocks = sum(batches) * ((context + steps * rounds * 2 + 64) // 16 + 2) * 2
    runners = {"cublas": ModelRunner(model, blocks, 16, "cuda:0"), "gemv": ModelRunner(model, blocks, 16, "cuda:0")}
    cycles = BlockedGpu(torch.device("cuda"), sleep_ms=100.0).cycles
    rows = []
    for b in batches:
        ids = list(range(b))
        prompt = [[3 + (7 * i + j) % 1000 for j in range(context)] for i in range(b)]
        state: dict[str, dict] = {}
        for name, runner in runners.items():
            model.use_decode_gemv(name == "gemv")
            logits = runner.forward(ids, prompt, [0] * b, last_n=1)
            state[name] = {"token": logits[:, -1].argmax(-1, keepdim=True), "pos": context, "tokens": [], "ms": []}
            for _ in range(2):  # captures this batch's graph with the path chosen now
                _decode(runner, ids, state[name], keep=False)
        model.use_decode_gemv(False)
        for r in range(rounds):
            for name in (("cublas", "gemv") if r % 2 == 0 else ("gemv", "cublas")):
                st, runner = state[name], runners[name]
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(cycles)
                start.record()
                for _ in range(steps):
                    _decode(runner, ids, st, keep=True)
                end.record()
                end.synchronize()
                st["ms"].append(start.elapsed_time(end) / steps)
        same = torch.cat(state["cublas"]["tokens"]) == torch.cat(state["gemv"]["tokens"])
        row = {"batch": b, "cublas_ms": statistics.median(state["cublas"]["ms"]),
               "gemv_ms": statistics.median(state["gemv"]["ms"]), "tokens_equal": int(same.sum()),
               "tokens": same.numel()}
        row["ratio"] = row["gemv_ms"] / row["cublas_ms"]
        rows.append(row)
        log(f"decode b={b}: cuBLAS {row['cublas_ms']:.3f} ms, GEMV {row['gemv_ms']:.3f} ms ({row['ratio']:.3f}x), "
            f"tokens equal {row['tokens_equal']}/{row['tokens']}")
        for runner in runners.values():
            for i in ids:
                runner.free(i)
    return rows


def _decode(runner: ModelRunner, ids: list[int], st: dict, keep: bool) -> None:
    """One greedy decode step fed back on the device (the host never waits); `keep` records the tokens."""
    b = len(ids)
    logits = runner.forward_on_device(ids, st["token"], [st["pos"]] * b, [1] * b, [st["pos"] + 1] * b, last_n=1)
    st["token"] = logits[:, -1].argmax(-1, keepdim=True)
    st["pos"] += 1
    if keep:
        st["tokens"].append(st["token"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m minedraft.bench.gpu.gemv_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--ms", default="1,4,16")
    p.add_argument("--configs", type=int, default=12, help="GEMV configs timed per projection and M")
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--skip-projections", action="store_true")
    args = p.parse_args(argv)
    copy = ceilings()["copy_GBps"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    result: dict = {"copy_GBps": copy, "sms": sms}
    if not args.skip_projections:
        result["projections"] = projection_rows(copy, [int(m) for m in args.ms.split(",")], sms, args.configs)
    result["decode"] = decode_rows([int(b) for b in args.batches.split(",")], 128, args.rounds, args.steps)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
