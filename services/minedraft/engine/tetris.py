"""TETRIS draft selection: keep the batch's most promising draft prefixes under a verification budget.

Each sequence drafts K = k + extra tokens. Slot j of row b is scored by an estimate of the chance
that the whole prefix up to and including slot j is accepted; the C best slots over the whole batch
are verified, so an easy sequence is verified deeper than a hard one and the verify checks C drafts
(plus one token per row) instead of B x K.

The score is chosen so that selection keeps the output lossless. The paper scores slot j by the
cumulative draft log-probability of x_0..x_j, which includes log q_j(x_j): whether slot j is
verified then depends on the very token it judges, and the output at that slot no longer follows
the target when drafts are sampled (a drafted token the draft likes is verified more often than one
it does not, and the rejection rule's correction assumes it is verified whatever it is;
tests/test_tetris_lossless.py measures the bias). Here slot j scores

    s_j = sum_{i<j} log q_i(x_i) + log max_x q_j(x),

a function of the drafts before slot j alone (q_j is known before x_j is drawn). For a greedy draft,
x_j is the argmax of q_j, so s_j is exactly the paper's score. The scores never rise with depth
(q_j(x_j) <= max q_j and max q_{j+1} <= 1), and ties are broken toward the shallower slot, then the
lower row, so the kept set is prefix-closed and selection is deterministic. Whether slot j of a row is
kept then depends on its own earlier drafts and on other rows' scores, never on x_j, and the usual
proof (each verified slot draws x ~ q_j independently of being verified) goes through slot by slot.
A floor on the score (`min_logp`: a slot the draft itself rates below it is not verified, whatever the
budget) is a rule on the same scores, so it keeps all three: s_j >= floor implies s_i >= floor for every
i < j, and whether slot j passes still depends on x_0..x_{j-1} alone.
"""

from __future__ import annotations

import math

import torch

DEFAULT_EXTRA = 3  # drafts per sequence beyond k (MineDraft's tetris_extra_proposals)


def token_logq(logits: torch.Tensor, token: torch.Tensor, prob: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """log q of each row's drafted token and the largest log q, [B] each, from one draft step's logits
    [B, 1, V] and tokens [B, 1]: q is what the token was sampled from (`prob`), or for an all-greedy batch
    the softmax of the logits (a greedy row's q is one-hot, which would score every slot alike).

    Only the [B] values are logged (log is monotonic, so the largest log q is the log of the largest q), and
    the softmax reads the logits in their own dtype into float32 (no float copy of the [B, V] logits first)."""
    if prob is not None:
        chosen, top = prob.gather(-1, token.unsqueeze(-1))[:, 0, 0], prob.amax(dim=-1)[:, 0]
        return chosen.float().clamp(min=1e-30).log(), top.float().clamp(min=1e-30).log()
    logq = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    return logq.gather(-1, token.unsqueeze(-1))[:, 0, 0], logq.amax(dim=-1)[:, 0]


def slot_scores(chosen_logq: torch.Tensor, top_logq: torch.Tensor) -> torch.Tensor:
    """s [B, K] from each slot's drafted token's log q [B, K] and the log of its largest q [B, K].

    The sum over i < j is an exclusive cumulative sum, never cumsum - log q_j: that difference rounds
    differently for different x_j, which would let x_j break ties between rows (and bias the output)."""
    before = torch.cumsum(chosen_logq[:, :-1], dim=1)
    return torch.cat((torch.zeros_like(chosen_logq[:, :1]), before), dim=1) + top_logq


def select_lengths(scores: torch.Tensor, budget: int, min_logp: float = -math.inf) -> torch.Tensor:
    """Per-row draft lengths [B] keeping the `budget` best slots of scores [B, K] that score at least
    `min_logp` (prefix-closed: scores never rise with depth), on the scores' device without a host sync.

    A stable sort over the slots listed depth-major (every row's slot 0, then every row's slot 1, ...)
    breaks ties toward the shallower slot and then the lower row; of the first `budget` sorted slots, those
    at or above the floor are kept (they come first in the sorted list)."""
    batch, width = scores.shape
    floor = min_logp > -math.inf
    if budget >= batch * width and not floor:
        return torch.full((batch,), width, dtype=torch.long, device=scores.device)
    if budget <= 0:
        return torch.zeros(batch, dtype=torch.long, device=scores.device)
    flat = scores.double().t().reshape(-1)  # depth-major
    order = torch.sort(-flat, stable=True).indices[:budget]
    keep = (flat[order] >= min_logp).long() if floor else torch.ones_like(order)
    kept = torch.zeros(batch * width, dtype=torch.long, device=scores.device).scatter_(0, order, keep)
    return kept.view(width, batch).sum(dim=0)


def wanted_drafts(scores: torch.Tensor, budget: int, min_logp: float = -math.inf) -> torch.Tensor:
    """How many slots a selection of at most `budget` would keep (a 0-d tensor on the scores' device): those at
    or above the floor, at most `budget`. A capacity below it cut the rest (engine/tetris_capacity.py)."""
    if min_logp == -math.inf:
        return torch.full((), min(budget, scores.numel()), dtype=torch.long, device=scores.device)
    return (scores.double() >= min_logp).sum().clamp(max=max(budget, 0))


def prune(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Drafts [B, K] with each row's slots at and past its length set to -1 (they are not verified)."""
    slot = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
    return torch.where(slot < lengths.unsqueeze(1), tokens, torch.full_like(tokens, -1))


def ragged_lengths(tokens: torch.Tensor) -> list[int] | None:
    """Per-row lengths of drafts [B, K] on the host, or None when no row was pruned (a fixed-k proposal)."""
    if tokens.numel() == 0 or int(tokens.min()) >= 0:
        return None
    return draft_lengths(tokens).tolist()


def draft_lengths(tokens: torch.Tensor) -> torch.Tensor:
    """Each row's verified draft count [B] from drafts pruned with -1 (a prefix of each row is kept)."""
    return (tokens >= 0).sum(dim=1)
