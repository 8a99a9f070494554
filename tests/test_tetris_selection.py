"""TETRIS selection (engine/tetris.py): prefix-closed, within the budget, the best slots, deterministic ties."""

from __future__ import annotations

import itertools

import torch

from minedraft.engine.tetris import draft_lengths, prune, select_lengths, slot_scores, token_logq


def random_scores(batch: int, width: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.rand(batch, width, generator=gen).clamp(min=1e-3).log()
    top = chosen + torch.rand(batch, width, generator=gen) * 0.5  # the top q is at least the chosen one's
    return slot_scores(chosen, top.clamp(max=0.0))


def test_scores_never_rise_with_depth() -> None:
    scores = random_scores(64, 6, 0)
    assert bool((scores[:, 1:] <= scores[:, :-1] + 1e-12).all())


def test_selection_is_prefix_closed_within_budget_and_keeps_the_best() -> None:
    for seed, (batch, width) in enumerate(itertools.product((1, 3, 16, 64), (1, 4, 9))):
        scores = random_scores(batch, width, seed)
        for budget in (0, 1, batch, batch * width // 2, batch * width - 1, batch * width, batch * width + 5):
            lengths = select_lengths(scores, budget)
            assert int(lengths.sum()) == min(budget, batch * width)
            assert bool(((lengths >= 0) & (lengths <= width)).all())
            kept = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)  # a prefix of every row by construction
            if kept.all() or not kept.any():
                continue
            # No dropped slot scores above a kept one: the kept set is the top of the batch.
            assert float(scores[~kept].max()) <= float(scores[kept].min())


def test_easy_rows_are_verified_deeper() -> None:
    easy = torch.log(torch.tensor([[0.95, 0.95, 0.95, 0.95]]))
    hard = torch.log(torch.tensor([[0.4, 0.3, 0.3, 0.3]]))
    scores = slot_scores(torch.cat((easy, hard)), torch.cat((easy, hard)))
    assert select_lengths(scores, 4).tolist() == [4, 0]
    assert select_lengths(scores, 5).tolist() == [4, 1]


def test_ties_go_to_the_shallower_slot_then_the_lower_row() -> None:
    scores = torch.zeros(3, 4)  # greedy drafts the draft is sure of: every slot scores 0
    assert select_lengths(scores, 5).tolist() == [2, 2, 1]
    assert select_lengths(scores, 5).tolist() == select_lengths(scores.clone(), 5).tolist()


def test_prune_marks_unverified_slots_and_lengths_read_them_back() -> None:
    tokens = torch.tensor([[5, 6, 7], [8, 9, 10], [1, 2, 3]])
    lengths = torch.tensor([3, 0, 2])
    pruned = prune(tokens, lengths)
    assert pruned.tolist() == [[5, 6, 7], [-1, -1, -1], [1, 2, -1]]
    assert draft_lengths(pruned).tolist() == [3, 0, 2]


def test_a_floor_keeps_only_slots_scoring_above_it_within_the_budget() -> None:
    for seed, (batch, width) in enumerate(itertools.product((1, 16, 64), (1, 4, 9))):
        scores = random_scores(batch, width, seed)
        for floor in (-0.5, -1.5, -4.0):
            above = int((scores.double() >= floor).sum())
            for budget in (1, batch * width // 2, batch * width):
                lengths = select_lengths(scores, budget, floor)
                assert int(lengths.sum()) == min(budget, above)
                kept = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
                assert bool((scores[kept] >= floor).all())
                # Prefix-closed and the batch's best: the same slots as the unfloored budget of that size.
                assert torch.equal(lengths, select_lengths(scores, min(budget, above)))


def test_a_floor_on_a_hand_case() -> None:
    probs = torch.tensor([[0.9, 0.8, 0.5, 0.2], [0.6, 0.3, 0.3, 0.3], [0.1, 0.9, 0.9, 0.9]])
    scores = slot_scores(probs.log(), probs.log())  # greedy: s_j = log prod_{i<=j} q_i
    # Cumulative: row 0 .9 .72 .36 .072; row 1 .6 .18 .054 .016; row 2 .1 .09 .081 .073.
    assert select_lengths(scores, 12).tolist() == [4, 4, 4]
    assert select_lengths(scores, 12, float(torch.tensor(0.15).log())).tolist() == [3, 2, 0]
    assert select_lengths(scores, 12, float(torch.tensor(0.08).log())).tolist() == [3, 2, 3]
    assert select_lengths(scores, 4, float(torch.tensor(0.08).log())).tolist() == [3, 1, 0]  # the budget binds
    assert select_lengths(scores, 12, 0.0).tolist() == [0, 0, 0]  # nothing is sure


def test_token_logq_is_the_log_softmax_at_the_drafted_token_and_at_its_largest_entry() -> None:
    """The scores' inputs computed without a float copy of the logits or a [B, V] log of the probabilities
    are the full log-softmax's (and log q's) values at the drafted token and at the largest entry."""
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(5, 1, 300, generator=gen) * 4).to(torch.bfloat16)
    token = torch.randint(0, 300, (5, 1), generator=gen)
    full = logits.float().log_softmax(dim=-1)
    chosen, top = token_logq(logits, token, None)
    assert chosen.dtype == top.dtype == torch.float32
    assert torch.allclose(chosen, full.gather(-1, token.unsqueeze(-1))[:, 0, 0], atol=1e-6)
    assert torch.allclose(top, full.amax(dim=-1)[:, 0], atol=1e-6)
    prob = full.exp()
    prob[0, 0, token[0, 0]] = 0.0  # a drafted token of probability 0 scores log 1e-30, not -inf
    chosen, top = token_logq(logits, token, prob)
    logq = prob.clamp(min=1e-30).log()
    assert torch.equal(chosen, logq.gather(-1, token.unsqueeze(-1))[:, 0, 0])
    assert torch.equal(top, logq.amax(dim=-1)[:, 0])
