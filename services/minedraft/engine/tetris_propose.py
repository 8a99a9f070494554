"""A drafter's TETRIS proposal: draft k + extra per sequence, keep the batch's best `budget` slots."""

from __future__ import annotations

import math
from dataclasses import replace

from minedraft.engine.drafter import Drafter, Proposal
from minedraft.engine.tetris import prune, select_lengths, wanted_drafts


def select(proposal: Proposal, budget: int, min_prob: float = 0.0, capacity: int | None = None) -> Proposal:
    """The proposal with only its best `budget` slots over the batch kept (the rest -1), none the draft rates
    below `min_prob` (engine/tetris.py's score as a probability).

    Without `capacity` each row's length is read back here, once per draft step, for a verifier that lays
    out its packed forward on its host (the data plane carries them as the -1s). With one, the `capacity` best
    slots are kept (the floor set the capacity, engine/tetris_capacity.py, and a verify of that size costs the
    same whatever fills it) and the counts stay on the device (`Proposal.counts`, with the count the floor and
    the budget would have kept, `wanted`), so the verify can be queued behind the draft; a capacity that keeps
    every draft (a probe step, engine/tetris_capacity.py) leaves no counts: the verify is the plain one."""
    assert proposal.scores is not None, "the drafter was not scoring"
    min_logp = math.log(min_prob) if min_prob > 0 else -math.inf
    if capacity is None:
        lengths = select_lengths(proposal.scores, budget, min_logp)
        return replace(proposal, tokens=prune(proposal.tokens, lengths), scores=None, lengths=lengths.tolist())
    kept = min(budget, capacity)
    wanted = wanted_drafts(proposal.scores, budget, min_logp)
    if kept >= proposal.tokens.numel():  # every draft stays: a plain verify (no packed layout), the count kept
        return replace(proposal, scores=None, wanted=wanted, capacity=kept)
    counts = select_lengths(proposal.scores, kept)
    return replace(proposal, tokens=prune(proposal.tokens, counts), scores=None, counts=counts, wanted=wanted,
                   capacity=kept)


def propose_selected(drafter: Drafter, seq_ids: list[int], width: int, budget: int,
                     min_prob: float = 0.0, capacity: int | None = None) -> Proposal:
    """`width` (k + extra) drafts per sequence scored, then selected down to `budget` drafts in all, none
    whose estimated acceptance is below `min_prob` (at most `capacity`, with the counts left on the device);
    a budget of 0, or one that covers every draft without a floor, is a plain proposal. Works for every
    drafter whose proposals go through `Drafter.draft_from` (a draft model, an EAGLE head)."""
    if budget <= 0 or (budget >= width * len(seq_ids) and min_prob <= 0):
        return drafter.propose(seq_ids, width)
    drafter.scoring = True
    try:
        proposal = drafter.propose(seq_ids, width)
    finally:
        drafter.scoring = False
    return select(proposal, budget, min_prob, capacity)
