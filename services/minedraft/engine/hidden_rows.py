"""Target hidden states travelling with a verdict: per row, a run of consecutive positions.

Row b's states are for positions starts[b] .. starts[b] + counts[b] - 1, stacked in `rows`. The verifier
ships every position it computed since the row's last verdict (prefill chunks, a prompt, the verify
window); the draft side keeps those that turned out committed. Float32 on the wire, so the states the
draft reads are the target's exactly (a bfloat16 value widens without rounding).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch


@dataclass(slots=True)
class HiddenRows:
    starts: list[int]
    counts: list[int]
    rows: torch.Tensor  # [sum(counts), F]

    def row(self, b: int) -> tuple[int, torch.Tensor]:
        """Row b's first position and its states [counts[b], F]."""
        offset = sum(self.counts[:b])
        return self.starts[b], self.rows[offset:offset + self.counts[b]]

    def split(self) -> list[tuple[int, torch.Tensor]]:
        ends = list(accumulate(self.counts))
        return [(s, self.rows[e - n:e]) for s, n, e in zip(self.starts, self.counts, ends, strict=True)]

    def reordered(self, order: list[int]) -> HiddenRows:
        """The rows in another order (a verify batch listed differently from the drafts)."""
        parts = self.split()
        picked = [parts[b] for b in order]
        rows = torch.cat([t for _, t in picked]) if picked else self.rows[:0]
        return HiddenRows([s for s, _ in picked], [t.shape[0] for _, t in picked], rows)
