"""The TETRIS benchmark's verdicts on its cells: exactness against AR, ratios measured side by side, and the
floor TETRIS cells prune by, from the costs the same run measured.

Every ratio compares cells of the same run and batch: a TETRIS cell against fixed k at its own k (what
selection buys at a verify budget), and per batch the best TETRIS cell against the best fixed k and AR.
"""

from __future__ import annotations

from minedraft.batch_manager.draft_budget import verify_floor


def equals_ar(tokens: list[list[int]], reference: list[list[int]]) -> bool:
    """Steps emit different counts; the prefix every row shares with AR's must be AR's."""
    return all(t[: len(r)] == r[: len(t)] for t, r in zip(tokens, reference, strict=True))


def ratio(num: float, den: float) -> float | None:
    return round(num / den, 3) if den else None


def first_of(cells: list[dict], kind: str, batch: int, k: int = 0) -> dict | None:
    return next((c for c in cells if c["kind"] == kind and (c["batch"], c["k"]) == (batch, k)), None)


def against_fixed(cell: dict, cells: list[dict]) -> dict:
    """A TETRIS cell's tokens/s, accepted tokens per verified token, verified and accepted tokens over fixed
    k's at its batch and k."""
    fixed = first_of(cells, "fixed", cell["batch"], cell["k"])
    if fixed is None:
        return {}
    return {"over_fixed_same_k": {key: ratio(cell[key], fixed[key]) for key in (
        "tokens_per_s", "accepted_per_verified_token", "verified_tokens", "accepted_tokens")}}


def measured_floor(cells: list[dict], batch: int, k: int) -> dict:
    """theta = m x R (batch_manager/draft_budget.verify_floor) from this run's cells at the batch: m, the
    verify ms per draft token, from fixed k's verify phase less AR's over its k x B drafts; R, fixed k's
    tokens per ms. The in-process SD step runs draft then verify, so every verify ms adds to the step. 0
    without both cells' phase times."""
    ar, fixed = first_of(cells, "ar", batch), first_of(cells, "fixed", batch, k)
    if ar is None or fixed is None or "verify_ms" not in ar or "verify_ms" not in fixed or k <= 0:
        return {"min_prob": 0.0}
    marginal_ms = (fixed["verify_ms"] - ar["verify_ms"]) / (k * batch)
    tokens_per_ms = fixed["tokens_per_s"] / 1000
    return {"min_prob": round(verify_floor(marginal_ms, tokens_per_ms), 4),
            "marginal_verify_ms_per_token": round(marginal_ms, 5), "tokens_per_ms": round(tokens_per_ms, 3)}


def batch_summary(batch: int, cells: list[dict]) -> dict | None:
    """Best TETRIS / best fixed k / AR by tokens/s at one batch, and their ratios; None without all three."""
    mine = [c for c in cells if c["batch"] == batch]
    best = {kind: max((c for c in mine if c["kind"] == kind), key=lambda c: c["tokens_per_s"], default=None)
            for kind in ("ar", "fixed", "tetris")}
    ar, fixed, tetris = best["ar"], best["fixed"], best["tetris"]
    if ar is None or fixed is None or tetris is None:
        return None
    return {"summary": "batch", "batch": batch, "ar_tokens_per_s": ar["tokens_per_s"],
            "best_fixed": {"k": fixed["k"], "tokens_per_s": fixed["tokens_per_s"]},
            "best_tetris": {"k": tetris["k"], "extra": tetris["extra"], "tokens_per_s": tetris["tokens_per_s"]},
            "tetris_over_best_fixed": ratio(tetris["tokens_per_s"], fixed["tokens_per_s"]),
            "tetris_over_ar": ratio(tetris["tokens_per_s"], ar["tokens_per_s"]),
            "fixed_over_ar": ratio(fixed["tokens_per_s"], ar["tokens_per_s"])}


def summaries(cells: list[dict]) -> list[dict]:
    """One summary per batch that has an AR, a fixed and a TETRIS cell, in the order the batches ran."""
    batches = list(dict.fromkeys(c["batch"] for c in cells))
    return [s for s in (batch_summary(b, cells) for b in batches) if s is not None]


def summary_line(summary: dict) -> str:
    """A summary for a reader: the best cells and the ratios between them."""
    fixed, tetris = summary["best_fixed"], summary["best_tetris"]
    return (f"batch {summary['batch']}: TETRIS k={tetris['k']}+{tetris['extra']} {tetris['tokens_per_s']} tok/s, "
            f"best fixed k={fixed['k']} {fixed['tokens_per_s']}, AR {summary['ar_tokens_per_s']}; "
            f"TETRIS / best fixed {summary['tetris_over_best_fixed']}, TETRIS / AR {summary['tetris_over_ar']}")
