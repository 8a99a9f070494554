"""Where a worker's step goes, from a torch.profiler window (worker/torch_profile.py).

Per "step N" annotation: its wall time, its phases (the `timed` fields: recv_wait_ms, control_ms,
compute_ms, send_ms), the GPU kernels it launched (matched through the runtime call's correlation
id, so a kernel that runs after the step's host code returned still counts for it), how long the GPU
was busy (union of kernel intervals, all streams) and how much of that was NCCL, the time from the
step's start to its first kernel, and the CUDA runtime calls that block the host. Averages over the
window's steps; `python -m minedraft.bench.gpu.trace_summary TRACE...` prints them.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

PHASES = ("recv_wait_ms", "control_ms", "compute_ms", "send_ms")
BLOCKING_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync",
                  "cudaMemcpy", "cudaStreamWaitEvent")


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def kernel_kind(name: str) -> str:
    low = name.lower()
    if low.startswith("nccl"):
        return "nccl"
    if any(word in low for word in ("gemm", "nvjet", "cutlass", "xmma", "gemv", "splitk")):
        return "gemm"
    return "other"


def load_events(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X"]


def summarize(path: Path) -> dict:
    events = load_events(path)
    steps = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("step ")),
                   key=lambda e: e["ts"])
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in runtime if "correlation" in e.get("args", {})}
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    phases = [e for e in events if e.get("cat") == "user_annotation" and e["name"] in PHASES]
    rows = []
    for step in steps:
        lo, hi = step["ts"], step["ts"] + step["dur"]
        mine = [k for k in kernels if lo <= launch_ts.get(k.get("args", {}).get("correlation"), -1.0) <= hi]
        spans = [(k["ts"], k["ts"] + k["dur"]) for k in mine]
        nccl = [(k["ts"], k["ts"] + k["dur"]) for k in mine if kernel_kind(k["name"]) == "nccl"]
        compute = [s for s, k in zip(spans, mine, strict=True) if kernel_kind(k["name"]) != "nccl"]
        by_kind: dict[str, float] = defaultdict(float)
        for k in mine:
            by_kind[kernel_kind(k["name"])] += k["dur"]
        row = {
            "wall_ms": step["dur"] / 1000.0,
            "kernels": len(mine),
            "gpu_busy_ms": busy_time(spans) / 1000.0,
            "gpu_compute_busy_ms": busy_time(compute) / 1000.0,
            "nccl_busy_ms": busy_time(nccl) / 1000.0,
            "first_kernel_after_ms": (min(s for s, _ in spans) - lo) / 1000.0 if spans else 0.0,
            "gpu_end_after_step_ms": (max(e for _, e in spans) - hi) / 1000.0 if spans else 0.0,
            **{f"{kind}_kernel_ms": t / 1000.0 for kind, t in by_kind.items()},
        }
        for phase in phases:
            if lo <= phase["ts"] <= hi:
                row[phase["name"]] = row.get(phase["name"], 0.0) + phase["dur"] / 1000.0
        for call in runtime:
            if lo <= call["ts"] <= hi and call["name"] in BLOCKING_CALLS:
                row[f"{call['name']}_ms"] = row.get(f"{call['name']}_ms", 0.0) + call["dur"] / 1000.0
        rows.append(row)
    keys = sorted({key for row in rows for key in row})
    mean = {key: statistics.fmean(row.get(key, 0.0) for row in rows) for key in keys} if rows else {}
    top: dict[str, float] = defaultdict(float)
    for k in kernels:
        top[k["name"][:60]] += k["dur"] / 1000.0
    heaviest = sorted(top.items(), key=lambda item: -item[1])[:8]
    return {"trace": path.name, "steps": len(rows), "mean": mean,
            "top_kernels_ms_per_step": {n: t / max(len(rows), 1) for n, t in heaviest}}


def render(summary: dict) -> str:
    lines = [f"{summary['trace']}: {summary['steps']} steps, means per step (ms)"]
    lines += [f"  {key:32s} {value:9.3f}" for key, value in summary["mean"].items()]
    lines.append("  heaviest kernels (ms per step):")
    lines += [f"    {t:7.3f}  {name}" for name, t in summary["top_kernels_ms_per_step"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    for arg in argv if argv is not None else sys.argv[1:]:
        print(render(summarize(Path(arg))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
