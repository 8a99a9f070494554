"""TETRIS's capacity (engine/tetris_capacity.py): a step's draft bound set before it drafts, from the last
step's wanted count rounded up so that batch + capacity is a packed graph's token count; a selection on the
device keeps at most that many of its best slots and reports what the budget alone would have kept."""

from __future__ import annotations

import math

import torch

from minedraft.engine.drafter import Proposal
from minedraft.engine.ragged_graphs import selection_keys
from minedraft.engine.tetris import select_lengths, wanted_drafts
from minedraft.engine.tetris_capacity import DraftCapacity, row_tile
from minedraft.engine.tetris_propose import select


def test_the_capacity_follows_the_last_wanted_count_to_a_packed_graphs_tokens() -> None:
    capacity = DraftCapacity(grained=True)
    assert capacity.limit(64, 256) == 256  # nothing measured: the whole budget
    capacity.observe(222, 256)
    assert capacity.limit(64, 256) == 224  # 64 + 222 = 286 tokens: the 288-token graph
    assert (64, 8, 8, 288) in selection_keys(64, 4, 3, 64)
    assert capacity.limit(64, 200) == 200  # never past the budget
    assert capacity.limit(40, 160) == 160  # 40 rows want the 264-token graph: more than their budget
    capacity.observe(100, 104)
    assert capacity.limit(40, 160) == 104  # 140 tokens -> 144 (6 x 24)
    assert capacity.limit(64, 256) == 128  # 164 -> 192
    capacity.observe(0, 0)
    assert capacity.limit(64, 256) == 0 and capacity.limit(63, 252) == 1  # 63 rows: the 64-token graph
    assert capacity.limit(64, 0) == 0
    capacity.observe(30, 20)
    assert (capacity.steps, capacity.cuts) == (4, 1)  # one step wanted more than it could keep
    eager = DraftCapacity()  # no packed graphs: the count itself
    eager.observe(101, 256)
    assert eager.limit(40, 160) == 101


def test_the_capacity_rounds_to_the_row_tile_and_a_step_saving_none_is_plain_fixed_k() -> None:
    """On CUDA a verify costs the same for every token count within a 128-row tile: at 64 rows and k = 3 a
    floor that wants 175 of 192 drafts saves nothing (239 tokens are two tiles, as 256 are), so the step keeps
    every draft without scoring, but for one probe in `probe_every`, half as often after each probe that finds
    nothing to prune; at k = 6 wanting 281 of 384 fills three tiles (320 drafts) instead of four."""
    assert row_tile("cuda:0") == 128 and row_tile("cpu") == 1
    capacity = DraftCapacity(128, grained=True, probe_every=4)
    assert capacity.plan(64, 3, 192) == (192, 192)  # nothing measured: score and select
    capacity.observe(175, 192)
    plans = [capacity.plan(64, 3, 192) for _ in range(4)]
    assert plans == [(0, None)] * 3 + [(192, 192)]
    capacity.observe(170, 192)  # the probe: still two tiles, so the next one comes 8 steps on
    plans = [capacity.plan(64, 3, 192) for _ in range(8)]
    assert plans == [(0, None)] * 7 + [(192, 192)]
    capacity.observe(176, 192)
    assert [capacity.plan(64, 3, 192) for _ in range(16)].count((0, None)) == 15  # then 16 on
    capacity.observe(60, 192)  # this probe finds one tile enough: every step selects, and probes come 4 apart
    assert capacity.plan(64, 3, 192) == (192, 64)
    capacity.observe(175, 64)
    assert [capacity.plan(64, 3, 192) for _ in range(4)] == [(0, None)] * 3 + [(192, 192)]
    assert capacity.plain == 3 + 7 + 15 + 3
    capacity.observe(100, 192)  # 164 tokens: two tiles, as 256 are
    assert capacity.limit(64, 192) == 192
    capacity.observe(60, 192)  # 124 tokens: one tile
    assert capacity.plan(64, 3, 192) == (192, 64)
    capacity.observe(281, 384)
    assert capacity.plan(64, 6, 384) == (384, 320)  # 345 tokens -> 384: three tiles of 128
    capacity.observe(380, 320)  # 444 tokens: four tiles, as 448 are
    assert capacity.plan(64, 7, 384) == (384, 384)  # the whole budget of 448 candidates (extra 1): still a choice
    assert capacity.plan(64, 6, 384) == (0, None)  # of 384: none, a plain step
    assert capacity.plan(64, 3, 0) == (0, None)  # no selection asked


def test_a_device_selection_keeps_its_capacitys_best_slots_and_says_what_the_budget_wanted() -> None:
    scores = torch.tensor([[-0.1, -0.5, -0.9], [-0.2, -0.3, -2.0], [-3.0, -4.0, -5.0]])
    floor = math.log(0.25)  # -1.386: five slots pass it
    assert select_lengths(scores, 9, floor).tolist() == [3, 2, 0]
    assert int(wanted_drafts(scores, 9, floor)) == 5 and int(wanted_drafts(scores, 4, floor)) == 4
    assert int(wanted_drafts(scores, 4)) == 4 and int(wanted_drafts(scores, 20)) == 9  # no floor: the budget
    tokens = torch.arange(9).view(3, 3)
    proposal = Proposal(tokens, None, scores=scores)
    chosen = select(proposal, 9, 0.25, capacity=3)
    assert chosen.lengths is None and chosen.counts is not None and chosen.capacity == 3  # nothing read back
    assert chosen.counts.tolist() == [1, 2, 0]  # the three best: -0.1 (row 0), -0.2 and -0.3 (row 1)
    assert chosen.tokens.tolist() == [[0, -1, -1], [3, 4, -1], [-1, -1, -1]]
    assert chosen.read_counts() == ([1, 2, 0], 5) and chosen.lengths == [1, 2, 0]
    host = select(Proposal(tokens, None, scores=scores), 9, 0.25)
    assert host.lengths == [3, 2, 0] and host.counts is None and host.read_counts() is None


def test_a_probe_whose_capacity_keeps_every_draft_is_verified_plain_and_still_reports_its_wanted_count() -> None:
    """A probe step (capacity = the whole budget, nothing beyond k to choose from) keeps every draft, so it has
    no packed layout: the verify is the plain padded one, and the floor's count comes back with the verdict."""
    scores = torch.tensor([[-0.1, -0.5, -0.9], [-0.2, -0.3, -2.0], [-3.0, -4.0, -5.0]])
    tokens = torch.arange(9).view(3, 3)
    probe = select(Proposal(tokens, None, scores=scores), 9, 0.25, capacity=9)
    assert probe.counts is None and probe.lengths is None and probe.scores is None  # plain to the verifier
    assert probe.tokens.tolist() == tokens.tolist() and probe.capacity == 9
    assert probe.read_counts() == ([3, 3, 3], 5) and probe.lengths is None
    capacity = DraftCapacity(128, grained=True)
    capacity.settle(probe)
    assert (capacity.wanted, capacity.steps, capacity.cuts) == (5, 1, 0)
    cut = select(Proposal(tokens, None, scores=scores), 9, 0.25, capacity=8)  # one slot short: packed
    assert cut.counts is not None and cut.counts.tolist() == [3, 3, 2]
