"""Markdown tables of the placement sweep (placement_sweep.py): throughput with its spread, the ratios the
issue's goals name, verify inside PSD against the same verify in sequential SD, and auto against fixed k."""

from __future__ import annotations

from collections import defaultdict


def rate(row: dict | None) -> str:
    if row is None:
        return "-"
    return f"{row['tokens_per_s']:.0f} ({row['tokens_per_s_min']:.0f}-{row['tokens_per_s_max']:.0f})"


def ratio(a: dict | None, b: dict | None, per_gpu: bool = False) -> str:
    if a is None or b is None:
        return "-"
    x = a["tokens_per_s"] / b["tokens_per_s"]
    if per_gpu:
        x *= b["gpus"] / a["gpus"]
    return f"{x:.2f}x"


def exact(cells: list[dict | None]) -> str:
    checked = [c for c in cells if c is not None and "rows_compared" in c]
    same = sum(c["rows_equal_ar"] for c in checked)
    total = sum(c["rows_compared"] for c in checked)
    return f"{same}/{total}" if total else "-"


def bound(row: dict, side: str) -> str:
    """A side's bandwidth bound per batch (bytes over the copy rate), where the run measured the rate."""
    return f"{row[f'{side}_bound_ms']:.2f}" if f"{side}_bound_ms" in row else "-"


def per_batch(row: dict, side: str) -> float:
    """A side's compute time per batch it handled (rows of older runs have only the per-plan mean)."""
    return row.get(f"{side}_ms_per_batch", row[f"{side}_ms"])


def level_of(row: dict) -> tuple[str, str, float]:
    """A row's level: the target's weights, what drafted, the acceptance goal (older rows: bf16, the draft model)."""
    return row.get("weights", "bf16"), row.get("drafter", "model"), row["goal"]


def level_name(level: tuple[str, str, float]) -> str:
    weights, drafter, goal = level
    return " ".join([str(goal), *([weights] if weights != "bf16" else []), *(["EAGLE"] if drafter == "eagle" else [])])


def summary_lines(rows: list[dict]) -> list[str]:
    cells: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        key = (level_of(r), r["m"]) if r["config"] == "AR" else (level_of(r), r["k"], r["m"])
        cells[key][r["config"]] = r
    out = ["| level | k | m | acceptance | AR | SD colocated (N GPUs) | SD-2GPU | PSD m/2+m/2 | PSD m+m | "
           "PSD m+m / SD coloc. | per GPU | equal conc. | rows = AR |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    anatomy = ["| level | k | m | verify ms per batch, SD-2GPU | same, PSD m+m | PSD/SD verify | verify bound ms | "
               "draft ms per batch, SD-2GPU | same, PSD m+m | draft bound ms | step ms PSD m+m | data plane ms | "
               "overlap eff. | verifier waits ms |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(k for k in cells if len(k) == 3):
        goal, k, m = key
        c = cells[key]
        col, sd2, half, full = (c.get(n) for n in ("SD colocated", "SD-2GPU", "PSD m/2+m/2", "PSD m+m"))
        if col is None and full is None:
            continue
        ar = cells.get((goal, m), {}).get("AR")
        acc = (col or full or {}).get("acceptance", 0.0)
        out.append(f"| {level_name(goal)} | {k} | {m} | {acc:.3f} | {rate(ar)} | {rate(col)} | {rate(sd2)} | "
                   f"{rate(half)} | "
                   f"{rate(full)} | **{ratio(full, col)}** | {ratio(full, col, True)} | {ratio(half, col)} | "
                   f"{exact([col, sd2, half, full])} |")
        if sd2 is not None and full is not None:
            sd_verify, psd_verify = per_batch(sd2, "verify"), per_batch(full, "verify")
            anatomy.append(f"| {level_name(goal)} | {k} | {m} | {sd_verify:.2f} | {psd_verify:.2f} | "
                           f"{psd_verify / max(sd_verify, 1e-9):.2f}x | {bound(full, 'verify')} | "
                           f"{per_batch(sd2, 'draft'):.2f} | {per_batch(full, 'draft'):.2f} | {bound(full, 'draft')} | "
                           f"{full['step_ms']:.2f} | {full.get('data_plane_ms', 0.0):.2f} | "
                           f"{full['overlap_efficiency']:.2f} | {full['verify_wait_ms']:.2f} |")
    auto = ["| level | m | fixed k: tok/s | best fixed k | auto: tok/s | auto / best fixed |",
            "|---|---|---|---|---|---|"]
    for level, m in sorted({(level_of(r), r["m"]) for r in rows if r["config"] == "PSD m+m auto"}):
        fixed = {r["k"]: r for r in rows if level_of(r) == level and r["m"] == m and r["config"] == "PSD m+m"}
        a = next(r for r in rows if level_of(r) == level and r["m"] == m and r["config"] == "PSD m+m auto")
        if not fixed:
            continue
        best = max(fixed.values(), key=lambda r: r["tokens_per_s"])
        listed = ", ".join(f"k={k}: {rate(r)}" for k, r in sorted(fixed.items()))
        auto.append(f"| {level_name(level)} | {m} | {listed} | {best['k']} | {rate(a)} | **{ratio(a, best)}** |")
    tetris = ["| level | k | m | placement | AR | fixed k | TETRIS | TETRIS / fixed k | TETRIS / AR | acceptance, "
              "TETRIS | rows = AR |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(k for k in cells if len(k) == 3):
        level, k, m = key
        ar = cells.get((level, m), {}).get("AR")
        for placement in ("SD colocated", "PSD m+m"):
            fixed, chosen = cells[key].get(placement), cells[key].get(f"{placement} TETRIS")
            if chosen is not None:
                tetris.append(f"| {level_name(level)} | {k} | {m} | {placement} | {rate(ar)} | {rate(fixed)} | "
                              f"{rate(chosen)} | **{ratio(chosen, fixed)}** | {ratio(chosen, ar)} | "
                              f"{chosen['acceptance']:.3f} | {exact([fixed, chosen])} |")
    return ["Throughput, tokens/s: median of the repetitions (min-max); a level is the acceptance goal, with the "
            "target's weights and EAGLE where they are not bf16 and the draft model.", "", *out, "",
            "Verify inside PSD against the same batch's verify in sequential SD (draft on its own GPU):", "",
            *anatomy, "", "Adaptive k (auto) against fixed k, PSD m+m:", "", *auto, "",
            "TETRIS selection against fixed k (PSD m+m: twice the concurrency of AR's m):", "", *tetris]
