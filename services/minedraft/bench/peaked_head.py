"""Peaked output heads for the synthetic pair: greedy choices with wide margins and a set agreement.

A random head over a random network gives nearly flat logits (the top two of 128k entries
differ by a few percent), so bf16 rounding in a different batch shape flips greedy near-ties
and SD stops matching AR. Here each head also carries, for every token x, the embedding row
of x scaled by PEAK_SCALE at the row of its chosen successor pi(x): the final hidden state
keeps a large component along e_x (the residual stream starts from it), so the logit of pi(x)
stands tens of units above every other. The target and the draft share pi on a seeded share
`agree` of the tokens and differ on the rest, so greedy acceptance per draft token is about
`agree`, with no calibration (bench/draft_confidence.py adds some), and the decision at each position
is far from a tie.
"""

from __future__ import annotations

import torch

PEAK_SCALE = 0.125  # on a unit-RMS hidden state of width H the chosen logit is ~ PEAK_SCALE * H / (1 + drift)


def successors(vocab: int, draft: bool, agree: float, seed: int, device: torch.device) -> torch.Tensor:
    """pi as a [vocab] index tensor: a seeded permutation for the target; the draft keeps it on a seeded
    share `agree` of tokens and uses a second permutation elsewhere (shifted where the two coincide)."""
    gen = torch.Generator(device="cpu").manual_seed(seed * 7919 + 17)
    target = torch.randperm(vocab, generator=gen)
    other = torch.randperm(vocab, generator=gen)
    keep = torch.rand(vocab, generator=gen) < agree
    if not draft:
        return target.to(device)
    other = torch.where(other == target, (other + 1) % vocab, other)
    return torch.where(keep, target, other).to(device)


def peaked_head(head: torch.Tensor, embedding: torch.Tensor, draft: bool, agree: float, seed: int) -> torch.Tensor:
    """head [V, H] (the random head) plus PEAK_SCALE * e_x at row pi(x) for every token x, in head's dtype."""
    pi = successors(head.shape[0], draft, agree, seed, head.device)
    out = head.float()
    out.index_add_(0, pi, embedding.float() * PEAK_SCALE)
    return out.to(head.dtype)


def acceptance_at(agree: float, k: int) -> float:
    """accepted / drafted with i.i.d. per-token agreement: a verify judges k drafts, keeps the right prefix."""
    return sum(agree ** (i + 1) for i in range(k)) / k


def agree_for_acceptance(goal: float, k: int = 4) -> float:
    """The per-token agreement whose acceptance (accepted / drafted) at k drafts is `goal` (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if acceptance_at(mid, k) < goal else (lo, mid)
    return round((lo + hi) / 2, 4)
