"""The three-service half of the GPU sweep: verifier and draft service on their own GPUs, NCCL
data plane; SD with the draft on its own GPU against PSD at equal and at doubled concurrency."""

from __future__ import annotations

import argparse
import io
import json
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from minedraft.bench.client import fetch_status, put_policy, run_workload, step_delta
from minedraft.bench.gpu.pairs import BenchPair
from minedraft.bench.gpu.timing import log
from minedraft.bench.workload import random_prompts
from minedraft.bundled import TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port

CONFIGS = (("SD-2GPU", "sd", 1), ("PSD m/2+m/2", "psd", 1), ("PSD m+m", "psd", 2))  # name, mode, concurrency / m


def stack_run(stack: LocalStack, batch: list[list[int]], max_tokens: int) -> dict[str, float]:
    cfg = stack.cfg
    run_workload(cfg.grpc_port, batch, 4)  # captures this size's graphs
    before = fetch_status(cfg.http_port)
    tokens, seconds = run_workload(cfg.grpc_port, batch, max_tokens)
    per_step = step_delta(fetch_status(cfg.http_port), before)
    busiest = max(per_step.get("verify_compute_ms", 0.0), per_step.get("draft_compute_ms", 0.0))
    return {
        "tokens_per_s": tokens / seconds,
        "seconds": seconds,
        "latency_per_request_s": seconds / len(batch),
        "steps": per_step["steps"],
        "acceptance": per_step["acceptance"],
        "step_ms": per_step.get("wall_ms", 0.0),
        "draft_ms": per_step.get("draft_compute_ms", 0.0),
        "verify_ms": per_step.get("verify_compute_ms", 0.0),
        "data_plane_ms": per_step.get("verify_send_ms", 0.0) + per_step.get("draft_send_ms", 0.0),
        "verify_wait_ms": per_step.get("verify_recv_wait_ms", 0.0),
        "draft_wait_ms": per_step.get("draft_recv_wait_ms", 0.0),
        "verify_plan_wait_ms": per_step.get("verify_plan_wait_ms", 0.0),
        "draft_plan_wait_ms": per_step.get("draft_plan_wait_ms", 0.0),
        "verify_control_ms": per_step.get("verify_control_ms", 0.0),
        "draft_control_ms": per_step.get("draft_control_ms", 0.0),
        "overlap_efficiency": busiest / per_step["wall_ms"] if per_step.get("wall_ms") else 0.0,
    }


def nccl_transport(log_dir: Path) -> str:
    """The NCCL transports the services' logs name (NCCL_DEBUG=INFO), e.g. P2P/CUMEM."""
    found = set()
    for f in log_dir.glob("*.log"):
        for line in f.read_text(errors="ignore").splitlines():
            m = re.search(r"via (P2P/\S+|SHM\S*|NET/\S+)", line)
            if m:
                found.add(m.group(1))
    return ", ".join(sorted(found)) or "unknown"


def services_sweep(args: argparse.Namespace, pair: BenchPair, log_dir: Path, ks: list[int], ms: list[int],
                   time_left: Callable[[], bool]) -> tuple[list[dict], str]:
    cfg = StackConfig(
        target=pair.target, draft=pair.draft, worker_module=pair.worker_module,
        grpc_port=free_port(), http_port=free_port(), tp_size=args.tp_size,
        target_device=",".join(f"cuda:{r}" for r in range(args.tp_size)), draft_device=f"cuda:{args.tp_size}",
        mode="psd", k=ks[0], threads=4, max_num_seqs=2 * max(ms), num_blocks=args.num_blocks,
        dtype="bfloat16", data_plane_backend="nccl", log_dir=log_dir,
        extra_env={"NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,P2P"},
        tokenizer=str(TINY_TARGET),
    )
    stack = LocalStack(cfg)
    rows = []
    try:
        stack.start(timeout=300)
        for k in ks:
            for m in ms:
                if not time_left():
                    log("deadline reached: skipping the rest of the service sweep")
                    return rows, nccl_transport(log_dir)
                for name, mode, per_m in CONFIGS:
                    conc = per_m * m
                    put_policy(stack.admin_port, mode=mode, k=k, max_num_seqs=conc,
                               pipeline_depth=args.pipeline_depth)
                    row = stack_run(stack, random_prompts(conc, seed=m), args.max_tokens)
                    row.update(config=name, k=k, m=m, concurrency=conc, gpus=args.tp_size + 1, alpha=pair.alpha,
                               tp_size=args.tp_size, pipeline_depth=args.pipeline_depth)
                    log(f"alpha {pair.alpha} k {k} m {m} {name}: {row['tokens_per_s']:.0f} tok/s, step "
                        f"{row['step_ms']:.2f} ms (draft {row['draft_ms']:.2f}, verify {row['verify_ms']:.2f}), "
                        f"overlap {row['overlap_efficiency']:.2f}")
                    rows.append(row)
    finally:
        stack.stop()
    return rows, nccl_transport(log_dir)


def host_profile(args: argparse.Namespace, pair: BenchPair, k: int = 4, m: int = 16) -> dict[str, str]:
    """cProfile of the verifier's and the draft service's loop threads over one PSD m+m run:
    where each side's per-step host time goes (a separate run; profiling slows the host)."""
    import pstats

    prof_dir = Path(tempfile.mkdtemp(prefix="minedraft_prof_"))
    cfg = StackConfig(target=pair.target, draft=pair.draft, worker_module=pair.worker_module,
                      grpc_port=free_port(), http_port=free_port(),
                      target_device="cuda:0", draft_device="cuda:1", mode="psd", k=k, threads=4,
                      max_num_seqs=2 * m, num_blocks=args.num_blocks, dtype="bfloat16", data_plane_backend="nccl",
                      tokenizer=str(TINY_TARGET),
                      extra_env={"NCCL_NVLS_ENABLE": "0", "MINEDRAFT_PROFILE_DIR": str(prof_dir),
                                 "MINEDRAFT_PROFILE_FROM_STEP": "40"})
    stack = LocalStack(cfg)
    try:
        stack.start(timeout=300)
        row = stack_run(stack, random_prompts(2 * m, seed=5), args.max_tokens)
        stack.kill("batch-manager")  # ends the workers' streams: they write their stats
        time.sleep(3)
    finally:
        stack.stop()
    out = {"run": json.dumps({key: round(v, 3) for key, v in row.items() if isinstance(v, float)})}
    for f in sorted(prof_dir.glob("*.pstats")):
        buf = io.StringIO()
        stats = pstats.Stats(str(f), stream=buf)
        stats.sort_stats("tottime").print_stats(30)
        out[f.stem.split("-")[0]] = buf.getvalue()[-9000:]
    return out
