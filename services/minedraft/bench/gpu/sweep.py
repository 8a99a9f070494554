"""GPU benchmark sweep for docs/benchmarks/gpu.md (`minedraft bench gpu`, a 2-GPU H200 machine).

One invocation measures, side by side on the same machine:
- the device ceilings (device-to-device copy bandwidth, bf16 matmul rate);
- AR decode of the Llama-3-8B-shaped target at batch 1 against that bandwidth;
- in-process AR and standard SD with the draft on the target's GPU;
- through the real three services (verifier on GPU 0, draft on GPU 1, NCCL data plane):
  standard SD with the draft on its own GPU (sequential) and PSD, at equal total
  concurrency (m/2 + m/2 vs m) and the paper's way (m + m vs m);
- transformers `generate` and assisted generation at batch 1 on the same weights;
- with `--step-table` (`--step-only`: it alone), the engine step per (batch, k) and weight format: its GPU
  time, its whole time and its bound side by side, with its host phases (step_profile.py).
The synthetic pair (minedraft.bench.synthetic_pair) is calibrated to per-token greedy acceptance
near 0.5, 0.7 and 0.9 first. Results: JSON, a markdown table and a PNG plot under --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from minedraft.bench.flags import add_gpu_sweep_flags
from minedraft.bench.gpu.inprocess import calibrate, inprocess_sweep
from minedraft.bench.gpu.pairs import TINY_ALPHA, bench_pair
from minedraft.bench.gpu.report import write_report
from minedraft.bench.gpu.services import host_profile, services_sweep
from minedraft.bench.gpu.step_profile import StepConfig, profile
from minedraft.bench.gpu.timing import ceilings, log
from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic


def recorded_args(args: argparse.Namespace) -> dict[str, object]:
    """This sweep's settings (not the other `minedraft bench` flags the namespace carries)."""
    own = argparse.ArgumentParser()
    add_gpu_sweep_flags(own)
    return {k: v for k, v in vars(args).items() if k in vars(own.parse_args([])) and k != "out"}


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()

    def time_left() -> bool:
        return time.monotonic() - started < args.deadline_s

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"args": recorded_args(args)}

    def save() -> None:
        (out / "results.json").write_text(json.dumps(results, indent=1))

    log(f"torch {torch.__version__}, {torch.cuda.device_count()} GPUs: {torch.cuda.get_device_name(0)}")
    results["topology"] = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout
    results["ceilings"] = ceilings()
    log(f"ceilings: {results['ceilings']}")
    if args.step_table or args.step_only:  # the engine step per (batch, k) against its GPU time and bound
        cfg = replace(StepConfig.from_args(args), copy_GBps=results["ceilings"]["copy_GBps"],
                      matmul_TFLOPs=results["ceilings"]["bf16_TFLOPs"], device="cuda:0")

        def saved(table: dict) -> None:
            results["step_table"] = table
            save()

        profile(cfg, saved)
        if args.step_only:
            log(f"report: {write_report(results, out)}")
            return 0
    goals = [float(x) for x in args.acceptance.split(",")]
    needs_draft = not (args.alphas and args.skip_inprocess)
    synthetic_draft = (build_synthetic(SyntheticSpec(args.shape, "draft", 0.0, args.draft_layers), "cuda:0",
                                       torch.bfloat16) if needs_draft else None)
    alphas: dict[float | str, float]
    if args.alphas:
        alphas = dict(zip(goals, [float(x) for x in args.alphas.split(",")], strict=True))
    else:
        alphas = dict(calibrate(args.shape, args.draft_layers, synthetic_draft, goals))
    results["alphas"] = {str(k): v for k, v in alphas.items()}
    if args.tiny:
        alphas["tiny"] = TINY_ALPHA  # the bundled pair, last: its acceptance is what it is

    def grid(goal: float | str) -> tuple[list[int], list[int]]:
        if goal == "tiny":
            return [4], args.small_ms
        return (args.ks, args.ms) if goal == args.full_grid else (args.small_ks, args.small_ms)

    inproc_rows: list[dict] = []
    service_rows: list[dict] = []
    transports: dict[str, str] = {}
    # The level with the full grid goes first, so a deadline cuts the small grids, not it.
    for goal in sorted(alphas, key=lambda g: g != args.full_grid):
        pair = bench_pair(args.shape, args.draft_layers, alphas[goal])
        if not time_left():
            log(f"deadline reached: acceptance {goal} not measured")
            break
        try:
            if not args.skip_inprocess:
                inproc_rows += inprocess_sweep(args, goal, pair, results, *grid(goal), synthetic_draft)
        except Exception as exc:  # keep what was measured; say what broke
            log(f"in-process sweep failed at alpha {pair.alpha}: {exc!r}")
            results.setdefault("errors", []).append(f"inprocess alpha {pair.alpha}: {exc!r}")
        torch.cuda.empty_cache()
        results["inprocess"] = inproc_rows
        save()
        if args.skip_services or not time_left():
            continue
        log_dir = Path(tempfile.mkdtemp(prefix=f"minedraft_logs_alpha{pair.alpha}_"))  # this run's NCCL lines only
        try:
            rows, transport = services_sweep(args, pair, log_dir, *grid(goal), time_left)
            service_rows += rows
            transports[str(pair.alpha)] = transport
        except Exception as exc:
            log(f"service sweep failed at alpha {pair.alpha}: {exc!r}")
            tails = {f.name: f.read_text(errors="ignore").splitlines()[-25:] for f in log_dir.glob("*.log")}
            results.setdefault("errors", []).append({"services": pair.alpha, "error": repr(exc), "logs": tails})
        results["services"] = service_rows
        results["nccl_transport"] = transports
        save()
    if not args.skip_services and args.profile_host and alphas:
        alpha = alphas.get(args.full_grid, next(iter(alphas.values())))
        try:
            results["host_profile"] = host_profile(args, bench_pair(args.shape, args.draft_layers, alpha))
            log(f"host profile: {results['host_profile'].get('run')}")
        except Exception as exc:
            results.setdefault("errors", []).append(f"host profile: {exc!r}")
        save()
    log(f"NCCL transport: {transports}")
    log(f"report: {write_report(results, out)}")
    log("done")
    return 0
