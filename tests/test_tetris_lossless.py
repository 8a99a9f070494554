"""Ragged draft lengths keep the rejection rule lossless (chi-square tests on a small vocabulary).

Each row is an independent trial: drafts x_j ~ q_j drawn as the draft service draws them, judged
against context-free target distributions p_j, with per-row lengths that are random, or chosen by
TETRIS over groups of rows. Whenever slot j is emitted its token must follow p_j. The same test fails
for a rule that puts the bonus at k only (q not zeroed at a shorter row's length) and for selection by
the paper's score, which looks at the very token a slot judges (engine/tetris.py), also when a floor on
that score prunes instead of the budget.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.rejection import Verdict, _first_rejection, verify_drafts
from minedraft.engine.sampling import (
    STREAM_ACCEPT,
    STREAM_DRAFT,
    STREAM_TARGET,
    BatchSampling,
    sample_from,
    uniforms,
)
from minedraft.engine.tetris import select_lengths, slot_scores
from tests.test_lossless_sampling import chi_square_pvalue

ROWS = 24000
K = 3
GROUP = 6  # rows selected together
P = torch.tensor([[0.2, 0.2, 0.2, 0.2, 0.2], [0.1, 0.4, 0.1, 0.3, 0.1], [0.5, 0.1, 0.1, 0.1, 0.2],
                  [0.3, 0.3, 0.2, 0.1, 0.1]], dtype=torch.float64)
Q = torch.tensor([[0.7, 0.1, 0.1, 0.05, 0.05], [0.1, 0.1, 0.6, 0.1, 0.1], [0.3, 0.3, 0.2, 0.1, 0.1]],
                 dtype=torch.float64)


def trial() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, BatchSampling, torch.Tensor]:
    seeds = torch.arange(ROWS, dtype=torch.long) * 7919 + 3
    positions = 40 + torch.arange(K + 1).unsqueeze(0).expand(ROWS, -1)
    draft_probs = Q.float().unsqueeze(0).expand(ROWS, -1, -1).contiguous()
    drafts = torch.stack([sample_from(draft_probs[:, j], uniforms(seeds, positions[:, j], STREAM_DRAFT))
                          for j in range(K)], dim=1)
    sampling = BatchSampling(torch.ones(ROWS), torch.zeros(ROWS, dtype=torch.long), torch.ones(ROWS), seeds)
    return drafts, draft_probs, positions, sampling, seeds


def judge(rule, lengths: torch.Tensor) -> tuple[torch.Tensor, Verdict]:
    drafts, draft_probs, positions, sampling, _ = trial()
    target = P.float().unsqueeze(0).expand(ROWS, -1, -1).contiguous()
    return drafts, rule(drafts, draft_probs, target, target.log(), sampling, positions, lengths)


FLOOR = math.log(0.05)  # prunes slot 1 after x_0 in {3, 4} (q 0.05) and slot 2 after most prefixes


def by_groups(scores: torch.Tensor, budget: int, min_logp: float = -math.inf) -> torch.Tensor:
    return torch.cat([select_lengths(block, budget, min_logp) for block in scores.split(GROUP)])


def lossless_lengths(drafts: torch.Tensor, budget: int = GROUP * K // 2, min_logp: float = -math.inf
                     ) -> torch.Tensor:
    q = Q.float().unsqueeze(0).expand(ROWS, -1, -1)
    chosen = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1).log()
    return by_groups(slot_scores(chosen, q.max(dim=-1).values.log()), budget, min_logp)


def paper_lengths(drafts: torch.Tensor, budget: int = GROUP * K // 2, min_logp: float = -math.inf) -> torch.Tensor:
    """The paper's score: cumulative log q of x_0..x_j, the judged token's own q included."""
    chosen = Q.float().unsqueeze(0).expand(ROWS, -1, -1).gather(-1, drafts.unsqueeze(-1)).squeeze(-1).log()
    return by_groups(torch.cumsum(chosen, dim=1), budget, min_logp)


def worst_pvalue(verdict: Verdict) -> float:
    """The smallest p-value over slots 0 and 1 of the emitted tokens' distributions against p_0, p_1."""
    pvalues = []
    for slot in range(2):
        emitted = verdict.tokens[:, slot][verdict.counts > slot]
        counts = np.bincount(emitted.numpy(), minlength=P.shape[1]).astype(float)
        pvalues.append(chi_square_pvalue(counts, P[slot].numpy()))
    return min(pvalues)


def bonus_at_k_only(drafts, draft_probs, target_probs, target_logits, sampling, positions, lengths) -> Verdict:
    """A plausible bug: pruned slots are never accepted, but q is zeroed only at slot k, so a row cut
    short draws its bonus from p - q instead of p."""
    batch, k = drafts.shape
    slot = torch.arange(k + 1).unsqueeze(0)
    p_x = target_probs[:, :k].gather(-1, drafts.unsqueeze(-1)).squeeze(-1).double()
    q_x = draft_probs.gather(-1, drafts.unsqueeze(-1)).squeeze(-1).double()
    accept = (uniforms(sampling.seed, positions[:, :k], STREAM_ACCEPT) * q_x <= p_x) & (slot[:, :k] < lengths[:, None])
    n_acc = _first_rejection(accept)
    rows = torch.arange(batch)
    q_last = torch.where((n_acc < k)[:, None], draft_probs[rows, n_acc.clamp(max=k - 1)], 0.0)
    residual = (target_probs[rows, n_acc] - q_last).clamp(min=0)
    final = sample_from(residual, uniforms(sampling.seed, positions[rows, n_acc], STREAM_TARGET))
    tokens = torch.where(slot < n_acc[:, None], torch.cat((drafts, drafts[:, :1]), dim=1), -1)
    tokens = torch.where(slot == n_acc[:, None], final[:, None], tokens)
    return Verdict(tokens, n_acc + 1, n_acc)


def random_lengths() -> torch.Tensor:
    return torch.randint(0, K + 1, (ROWS,), generator=torch.Generator().manual_seed(5))


def test_random_ragged_lengths_follow_the_target() -> None:
    _, verdict = judge(verify_drafts, random_lengths())
    assert worst_pvalue(verdict) > 1e-3
    assert int(verdict.accepted.max()) == K and bool((verdict.accepted <= random_lengths()).all())


def test_tetris_selected_lengths_follow_the_target() -> None:
    drafts = trial()[0]
    lengths = lossless_lengths(drafts)
    assert len(set(lengths.tolist())) > 1 and int(lengths.sum()) == ROWS * K // 2  # ragged, within budget
    _, verdict = judge(verify_drafts, lengths)
    assert worst_pvalue(verdict) > 1e-3


def test_lengths_cut_by_a_floor_follow_the_target() -> None:
    """The floor alone (a budget covering every draft: TETRIS with no extra drafts), then floor and budget."""
    drafts = trial()[0]
    floored = lossless_lengths(drafts, GROUP * K, FLOOR)
    assert 0 < int(floored.sum()) < ROWS * K and len(set(floored.tolist())) > 1  # the floor pruned, raggedly
    _, verdict = judge(verify_drafts, floored)
    assert worst_pvalue(verdict) > 1e-3
    both = lossless_lengths(drafts, GROUP * K // 2, FLOOR)
    assert bool((both <= floored).all()) and int(both.sum()) < int(floored.sum())
    _, verdict = judge(verify_drafts, both)
    assert worst_pvalue(verdict) > 1e-3


def test_the_test_catches_a_floor_on_the_judged_tokens_own_probability() -> None:
    drafts = trial()[0]
    _, verdict = judge(verify_drafts, paper_lengths(drafts, GROUP * K, FLOOR))
    assert worst_pvalue(verdict) < 1e-6


def test_the_test_catches_a_bonus_drawn_as_if_at_k() -> None:
    _, verdict = judge(bonus_at_k_only, random_lengths())
    assert worst_pvalue(verdict) < 1e-6


def test_the_test_catches_selection_by_the_judged_tokens_own_probability() -> None:
    drafts = trial()[0]
    _, verdict = judge(verify_drafts, paper_lengths(drafts))
    assert worst_pvalue(verdict) < 1e-6


def test_full_lengths_equal_the_unragged_rule() -> None:
    _, ragged = judge(verify_drafts, torch.full((ROWS,), K))
    _, plain = judge(lambda *args: verify_drafts(*args[:-1]), torch.full((ROWS,), K))
    assert torch.equal(ragged.tokens, plain.tokens)


def test_greedy_ragged_rows_stop_at_their_length() -> None:
    target_logits = torch.tensor([[[0.0, 5.0, 0.0]] * 4] * 3)  # argmax 1 everywhere
    drafts = torch.tensor([[1, 1, 1], [1, 1, -1], [1, -1, -1]])
    lengths = torch.tensor([3, 2, 0])
    sampling = BatchSampling.from_params([SamplingParams(temperature=0.0)] * 3)
    verdict = verify_drafts(drafts, None, target_logits, target_logits, sampling, torch.zeros(3, 4, dtype=torch.long),
                            lengths)
    assert verdict.accepted.tolist() == [3, 2, 0]
    assert verdict.tokens.tolist() == [[1, 1, 1, 1], [1, 1, 1, -1], [1, -1, -1, -1]]
