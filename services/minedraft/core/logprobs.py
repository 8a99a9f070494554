"""Log-probabilities of tokens as the target model gave them, in the shape every API layer formats."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TokenLogprob:
    """One token's log-probability, its rank (1: the most likely) and the `top` alternatives, most likely
    first, as (token id, log-probability). All values come from one float32 tensor, so the chosen token's
    value equals its entry in `top` when it is the most likely (the "is greedy" check of evaluation harnesses)."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]] = field(default_factory=list)


def cumulative(entries: list[TokenLogprob]) -> float:
    return sum(e.logprob for e in entries)
