"""The engine step against its GPU time and its bandwidth bound, as tables (no torch: renders anywhere).

One row per measured cell (weights, step kind, batch, k): the step's GPU time (its kernels run back
to back, the host never in the way), its whole time (what a step takes as the engine runs it, host
work included) and its bound, the bytes the step must read (weights once per forward, plus the KV
every query attends to) over the measured device-to-device copy bandwidth. The host phases say where
the whole step's host time goes (`phase_clock.py` names them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MODES = ("ar", "verify", "sd2", "psd", "draft", "psd-draft", "fused")
MODE_LABELS = {"ar": "AR", "verify": "SD verify", "sd2": "SD-2GPU verify (drafts posted)",
               "psd": "PSD verify (launched ahead)", "draft": "draft (k steps)",
               "psd-draft": "PSD draft (launched ahead)", "fused": "SD colocated fused"}
DRAFTING = ("draft", "psd-draft")  # cells that run only the draft model
SAMPLINGS = ("greedy", "penalties", "sampled", "logprobs")  # the rows' kind (cell_rows.row_spec); greedy: plain
PHASES = ("plan decode", "block tables", "sampling tensors", "input copies", "graph replay", "eager launches",
          "readback queue", "readback wait", "commit", "other")
WAIT = "readback wait"
BOUND_GOAL = 0.90  # the goal: the whole step at >= 90% of the bound
HOST_GOAL = 1.03  # ... and within 3% of its GPU time


def label(row: dict) -> str:
    """The step's name in the tables: its mode, and the rows' processing where there is any."""
    name = MODE_LABELS[row["mode"]]
    return name if row.get("sampling", "greedy") == "greedy" else f"{name}, {row['sampling']}"


@dataclass(frozen=True, slots=True)
class ModelBytes:
    """What one forward of a model reads: its weights once, and `kv_per_token` bytes per attended position."""

    weights: int
    kv_per_token: int
    matmul_params: int = 0  # parameters a token multiplies through (all but the embedding): 2 FLOPs each

    @classmethod
    def of(cls, weights: int, layers: int, kv_heads: int, head_dim: int, kv_elem: int,
           matmul_params: int = 0) -> ModelBytes:
        return cls(weights, 2 * layers * kv_heads * head_dim * kv_elem, matmul_params)

    def forward(self, attended: Iterable[int]) -> int:
        """Bytes of one forward whose rows attend to `attended` positions each."""
        return self.weights + self.kv_per_token * sum(attended)


def draft_bytes(model: ModelBytes, lengths: list[int], k: int) -> int:
    """A proposal of k drafts: k forwards, the i-th attending to each row's length + i positions."""
    return sum(model.forward(n + i for n in lengths) for i in range(k))


def bound_ms(total_bytes: float, copy_GBps: float) -> float:
    return total_bytes / (copy_GBps * 1e6)


def step_flops(mode: str, batch: int, k: int, target: ModelBytes, draft: ModelBytes | None) -> int:
    """The matmul FLOPs a step cannot avoid: the target scores batch x (k + 1) tokens (1 for AR); a proposal
    is k draft forwards of at least one token per row (attention's FLOPs left out: a floor)."""
    flops = 2 * target.matmul_params * batch * (1 if mode == "ar" else k + 1) if mode not in DRAFTING else 0
    if mode in (*DRAFTING, "fused") and draft is not None:
        flops += 2 * draft.matmul_params * batch * k
    return flops


def compute_ms(flops: float, TFLOPs: float) -> float:
    return flops / (TFLOPs * 1e9) if TFLOPs else 0.0


def summarize(row: dict) -> dict:
    """Add the ratios the goals are stated in: bound / whole and whole / GPU (0 where unmeasured). A cycle whose
    drafts land `land_ms` after its verify (the "sd2" cell: the draft GPU's time) counts that time as device time
    (whole / (GPU + land)), and its bound shares are of the cycle less it (the verifier's own part)."""
    whole, gpu, bound = row.get("whole_ms", 0.0), row.get("gpu_ms", 0.0), row.get("bound_ms", 0.0)
    land = row.get("land_ms", 0.0)
    own = whole - land
    row["floor_ms"] = max(bound, row.get("compute_ms", 0.0))
    row["bound_share"] = bound / own if own > 0 else 0.0
    row["floor_share"] = row["floor_ms"] / own if own > 0 else 0.0
    row["whole_over_gpu"] = whole / (gpu + land) if gpu else 0.0
    phases = row.get("phases", {})
    row["host_ms"] = sum(v for name, v in phases.items() if not name.endswith(WAIT))
    return row


def fmt(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def _key(row: dict) -> tuple:
    return (row.get("weights", "bf16"), MODES.index(row["mode"]), row["k"], row["batch"],
            SAMPLINGS.index(row.get("sampling", "greedy")))


def step_table(rows: list[dict]) -> list[str]:
    """GPU time, whole time and bound side by side per (weights, step, batch, k); the compute floor (FLOPs over
    the measured matmul rate, where known) beside the bandwidth bound, and the whole step over the larger."""
    out = ["| weights | step | batch | k | GPU ms | whole ms | bound ms | compute ms | bound / whole | "
           "floor / whole | whole / GPU |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in sorted((summarize(dict(r)) for r in rows), key=_key):
        share, floor, excess = row["bound_share"], row["floor_share"], row["whole_over_gpu"]
        compute = fmt(row["compute_ms"]) if row.get("compute_ms") else "-"
        gpu = fmt(row["gpu_ms"]) + (f" + {fmt(row['land_ms'])} landing" if row.get("land_ms") else "")
        out.append(f"| {row.get('weights', 'bf16')} | {label(row)} | {row['batch']} | {row['k']} | "
                   f"{gpu} | {fmt(row['whole_ms'])} | {fmt(row['bound_ms'])} | {compute} | "
                   f"{fmt(100 * share, 1)}%{'' if share >= BOUND_GOAL else ' *'} | "
                   f"{fmt(100 * floor, 1)}%{'' if floor >= BOUND_GOAL else ' *'} | "
                   f"{fmt(excess, 3)}{'' if excess <= HOST_GOAL else ' *'} |")
    return out


def merged_phases(phases: dict[str, float]) -> tuple[dict[str, float], float]:
    """Phases with a scope's ("draft: graph replay") folded into the plain name, and the scoped total."""
    merged = dict.fromkeys(PHASES, 0.0)
    scoped = 0.0
    for name, ms in phases.items():
        scope, _, plain = name.rpartition(": ")
        merged[plain] = merged.get(plain, 0.0) + ms
        if scope:
            scoped += ms
    return merged, scoped


def phase_table(rows: list[dict]) -> list[str]:
    """Host milliseconds per step by phase (the instrumented steps' means); the draft column is the part of
    the row spent inside the draft model's proposal (already counted in the phase columns)."""
    head = "| weights | step | batch | k | step ms (instrumented) | "
    out = [head + " | ".join(PHASES) + " | of which in the draft |",
           "|---|---|---|---|---|" + "---|" * (len(PHASES) + 1)]
    for row in sorted(rows, key=_key):
        merged, scoped = merged_phases(row.get("phases", {}))
        cells = " | ".join(fmt(merged[name], 3) for name in PHASES)
        out.append(f"| {row.get('weights', 'bf16')} | {label(row)} | {row['batch']} | {row['k']} | "
                   f"{fmt(row.get('phased_whole_ms', 0.0))} | {cells} | {fmt(scoped, 3)} |")
    return out


def report_lines(results: dict) -> list[str]:
    """The step section of a results page: ceilings, the step table, the phase table, and what was late."""
    rows = results.get("rows", [])
    if not rows:
        return []
    rate = f", bf16 matmul {fmt(results['matmul_TFLOPs'], 0)} TFLOP/s" if results.get("matmul_TFLOPs") else ""
    lines = [f"Engine step against its GPU time and the bound (copy bandwidth {fmt(results['copy_GBps'], 0)} GB/s"
             f"{rate}, context {results.get('context', '?')} tokens at the start; * misses the goal: bound / whole "
             f">= {BOUND_GOAL:.0%}, whole / GPU <= {HOST_GOAL}):", ""]
    lines += step_table(rows)
    lines += ["", "Host time per step by phase (ms):", ""]
    lines += phase_table(rows)
    if any(r.get("land_ms") for r in rows):
        lines += ["", "SD-2GPU verify: each plan's drafts land the draft cell's GPU ms (same batch and k) after the "
                  "verify before it; whole / GPU is the cycle over GPU + landing, bound / whole the cycle less the "
                  "landing (the verifier's own part)."]
    late = [r for r in rows if r.get("late_segments")]
    if late:
        lines += ["", "GPU time caught the host up in " + ", ".join(
            f"{label(r)} b={r['batch']} k={r['k']} ({r['late_segments']})" for r in late)
            + " segments: those GPU times may include host gaps."]
    for error in results.get("errors", []):
        lines += ["", f"Not measured: {error}"]
    return lines
