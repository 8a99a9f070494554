"""Turn the GPU sweep's results.json into markdown tables and a PNG plot (`minedraft bench gpu-report`).

Runs on the device at the end of the sweep (matplotlib is there) and anywhere else on a
copied results.json (the plot is skipped where matplotlib is missing).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from minedraft.bench.gpu.step_report import report_lines


def fmt(x: float, digits: int = 1) -> str:
    return f"{x:.{digits}f}"


def pair_label(alpha: float) -> str:
    """The synthetic pair's alpha, or the bundled tiny pair (recorded as alpha -1)."""
    return "tiny pair" if alpha < 0 else str(alpha)


def throughput_table(rows: list[dict]) -> list[str]:
    """All configurations side by side per (acceptance, k, m), with ratios to SD-1GPU."""
    by_key: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        by_key[(r["alpha"], r["k"], r["m"])][r["config"]] = r
    ar = {(r["alpha"], r["m"]): r for r in rows if r["config"] == "AR"}
    out = ["| alpha | k | m | config | GPUs | concurrency | acceptance | tok/s | tok/s/GPU | vs SD-1GPU | "
           "latency/request s | step ms | draft ms | verify ms | overlap eff. | data-plane ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (alpha, k, m), configs in sorted(by_key.items()):
        if k == 0:
            continue
        base = configs.get("SD-1GPU")
        cells = [ar.get((alpha, m))] + [configs.get(c) for c in ("SD-1GPU", "SD-2GPU", "PSD m/2+m/2", "PSD m+m")]
        for r in (c for c in cells if c is not None):
            ratio = fmt(r["tokens_per_s"] / base["tokens_per_s"], 2) + "x" if base else "-"
            out.append(
                f"| {pair_label(alpha)} | {k} | {m} | {r['config']} | {r['gpus']} | {r['concurrency']} | "
                f"{fmt(r.get('acceptance', 0.0), 3)} | {fmt(r['tokens_per_s'])} | "
                f"{fmt(r['tokens_per_s'] / r['gpus'])} | {ratio} | {fmt(r['latency_per_request_s'], 3)} | "
                f"{fmt(r.get('step_ms', 0.0), 2)} | {fmt(r.get('draft_ms', 0.0), 2)} | "
                f"{fmt(r.get('verify_ms', 0.0), 2)} | "
                f"{fmt(r.get('overlap_efficiency', 0.0), 2)} | {fmt(r.get('data_plane_ms', 0.0), 3)} |"
            )
    return out


def plot(rows: list[dict], path: Path, k: int) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    alphas = sorted({r["alpha"] for r in rows})
    fig, axes = plt.subplots(1, len(alphas), figsize=(5 * len(alphas), 4), squeeze=False)
    for ax, alpha in zip(axes[0], alphas, strict=True):
        for config in ("AR", "SD-1GPU", "SD-2GPU", "PSD m/2+m/2", "PSD m+m"):
            pts = sorted((r["m"], r["tokens_per_s"]) for r in rows
                         if r["alpha"] == alpha and r["config"] == config and r["k"] in (k, 0))
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=config)
        ax.set_title(f"{'the bundled tiny pair' if alpha < 0 else f'alpha {alpha}'}, k={k}")
        ax.set_xlabel("m (requests per batch)")
        ax.set_ylabel("tokens/s")
        ax.set_xscale("log", base=2)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def write_report(results: dict, out_dir: Path) -> Path:
    rows = results.get("inprocess", []) + results.get("services", [])
    lines = ["# GPU sweep results", ""]
    c = results.get("ceilings", {})
    if c:
        lines += [f"Ceilings: copy {fmt(c['copy_GBps'])} GB/s, bf16 matmul {fmt(c['bf16_TFLOPs'])} TFLOP/s.", ""]
    if results.get("step_table"):
        lines += [*report_lines(results["step_table"]), ""]
    bw = results.get("ar_bandwidth")
    if bw and c:
        lines += [f"AR decode, batch 1: {fmt(bw['step_ms'], 2)} ms/step, {fmt(bw['achieved_GBps'])} GB/s = "
                  f"{fmt(100 * bw['achieved_GBps'] / c['copy_GBps'])}% of copy bandwidth (one step, host preparation "
                  "serial with the GPU).", ""]
        if "loop_step_ms" in bw:
            lines += [f"AR decode loop, batch 1, token fed back on the device: {fmt(bw['loop_step_ms'], 2)} ms/step, "
                      f"{fmt(bw['loop_GBps'])} GB/s = {fmt(100 * bw['loop_GBps'] / c['copy_GBps'])}% of copy "
                      "bandwidth.", ""]
        if bw.get("profile"):
            lines += ["Profile of 10 batch-1 decode steps:", "", "```", bw["profile"].rstrip(), "```", ""]
    if results.get("batch1"):
        lines += ["Batch 1: " + ", ".join(f"{k} = {v if not isinstance(v, float) else fmt(v)}"
                                          for k, v in results["batch1"].items()), ""]
    if results.get("nccl_transport"):
        lines += [f"NCCL transport: {results['nccl_transport']}", ""]
    if rows:
        lines += throughput_table(rows)
    for side, text in results.get("host_profile", {}).items():
        if side != "run":
            lines += ["", f"Host profile of the {side} loop thread (cProfile, one PSD m+m run, k=4, m=16):", "",
                      "```", text.strip(), "```"]
    if rows and plot(rows, out_dir / "throughput.png", k=4):
        lines += ["", "![throughput](throughput.png)"]
    path = out_dir / "results.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def run(args: argparse.Namespace) -> int:
    src = Path(args.results)
    out = Path(args.out) if args.out else src.parent
    out.mkdir(parents=True, exist_ok=True)
    print(write_report(json.loads(src.read_text()), out))
    return 0
