"""Drafting from a verdict still on the device (engine/draft_ahead.py, draft_service/launch_ahead.py).

The ahead path must leave the drafter exactly where `commit` + `propose` leave it: the same drafts (and
draft distributions for sampled rows), the same committed tokens, the same cached positions and KV
blocks, for every accepted count from 0 to kd and for k changing between steps. The whole service path
runs in tests/test_psd_stack.py (its draft service launches ahead)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from minedraft.core.sampling_params import SamplingParams
from minedraft.draft_service.launch_ahead import AwaitedVerdict, launchable_kd
from minedraft.engine.draft_ahead import awaited_k, propose_ahead, room_to_draft_ahead, settle
from minedraft.engine.drafter import Drafter
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.engine.sequence import SeqState
from minedraft.proto import control_pb2

PROMPTS = {11: [5, 9, 3], 12: [7, 7, 8, 2, 40, 41, 42], 13: [60], 14: [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]}
PARAMS = {11: SamplingParams(max_tokens=64), 12: SamplingParams(max_tokens=64, temperature=0.8, seed=3),
          13: SamplingParams(max_tokens=64), 14: SamplingParams(max_tokens=64, temperature=1.3, top_k=20, seed=9)}


def drafter(path, device: str = "cpu") -> Drafter:
    d = Drafter(ModelRunner(load_model(path, device=device), 96, 4, device=device))
    for seq_id, prompt in PROMPTS.items():
        d.add(seq_id, prompt, PARAMS[seq_id])
    return d


def verdict(drafts: torch.Tensor, accepted: list[int], step: int) -> torch.Tensor:
    """What a verifier would send: the accepted drafts, then a token of its own, -1 after."""
    kd = drafts.shape[1]
    rows = torch.full((len(accepted), kd + 1), -1, dtype=torch.long)
    for i, n in enumerate(accepted):
        rows[i, :n] = drafts[i, :n].cpu()
        rows[i, n] = 17 + 13 * i + step  # never a draft's own token, so acceptance is not implied
    return rows


def ahead_against_host(path, device: str = "cpu") -> float:
    """Run both paths over rounds that give every row every accepted count 0..kd, with k changing
    (adaptive k); assert identical bookkeeping and return the share of identical drafts."""
    host, ahead = drafter(path, device), drafter(path, device)
    ids = list(PROMPTS)
    kd = 3
    drafts = host.propose(ids, kd).tokens
    ahead.propose(ids, kd)
    same = total = 0
    schedule = [([0, 3, 1, 2], 3), ([3, 0, 2, 1], 4), ([4, 4, 0, 3], 2), ([1, 2, 2, 0], 1), ([1, 0, 1, 1], 3)]
    for step, (accepted, k) in enumerate(schedule):
        rows = verdict(drafts, accepted, step)
        for seq_id, row, n in zip(ids, rows.tolist(), accepted, strict=True):
            host.commit(seq_id, row[: n + 1], n)
        want = host.propose(ids, k)
        got = propose_ahead(ahead, ids, kd, k, ahead.runner.to_device(torch.tensor(accepted)),
                            ahead.runner.to_device(rows))
        settle(ahead, ids, rows.tolist(), accepted, k)
        same += int((got.tokens == want.tokens).sum())
        total += want.tokens.numel()
        assert got.probs is not None and want.probs is not None and got.probs.shape == want.probs.shape
        if device == "cpu":  # one reduction order: the same distributions to rounding
            torch.testing.assert_close(got.probs, want.probs)
        for seq_id in ids:
            h, a = host.seqs[seq_id], ahead.seqs[seq_id]
            assert (a.tokens, a.cached) == (h.tokens, h.cached), f"round {step}, sequence {seq_id}"
            assert len(ahead.runner.allocator.table(seq_id)) == len(host.runner.allocator.table(seq_id))
            assert awaited_k(ahead, seq_id) == k
        drafts, kd = want.tokens, k
    assert ahead.runner.allocator.num_free == host.runner.allocator.num_free  # nothing reserved is kept
    return same / total


def test_drafts_from_a_device_verdict_equal_commit_then_propose(random_pair) -> None:
    assert ahead_against_host(random_pair[1]) == 1.0  # on the CPU: token for token


def test_no_room_for_the_worst_case_keeps_the_ordinary_path(random_pair) -> None:
    d = drafter(random_pair[1])
    ids = list(PROMPTS)
    d.propose(ids, 4)
    assert room_to_draft_ahead(d, ids, 4, 4)
    limit = d.runner.config.max_position_embeddings
    assert not room_to_draft_ahead(d, [13], 4, limit)  # past the model's positions
    d.runner.allocator.ensure(99, 4 * d.runner.allocator.num_free)  # another sequence takes every free block
    assert not room_to_draft_ahead(d, ids, 4, 4)


def awaiting(**cached: int) -> SimpleNamespace:
    """Sequences 1-4 of three tokens that await a verdict of a kd = 3 proposal (KV two past their tokens)."""
    seqs = {s: SeqState(s, [5, 6, 7], SamplingParams(max_tokens=8), cached=5) for s in (1, 2, 3, 4)}
    for key, value in cached.items():
        seqs[int(key[1:])].cached = value
    runner = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512),
                             allocator=SimpleNamespace(num_free=100, extra_blocks_needed=lambda s, n: 1))
    return SimpleNamespace(seqs=seqs, runner=runner, grammars=SimpleNamespace(rows=lambda ids: []))


def grammar_row() -> SimpleNamespace:
    """As `awaiting`, with sequence 4 under a grammar (its masks need each draft on the host)."""
    drafter = awaiting()
    drafter.grammars = SimpleNamespace(rows=lambda ids: [i for i, s in enumerate(ids) if s == 4])
    return drafter


def test_which_plans_draft_ahead() -> None:
    awaited = AwaitedVerdict(step=7, seq_ids=[3, 4])
    plain = {"step": 8, "draft_batch": [3, 4], "verify_batch": [1, 2], "with_drafts": True, "k": 4}
    assert launchable_kd(awaiting(), awaited, control_pb2.StepPlan(**plain), [1, 2]) == 3
    cases = {
        "no verdict awaited": (awaiting(), None, {}),
        "drafting switched off": (awaiting(), awaited, {"with_drafts": False}),
        "another batch": (awaiting(), awaited, {"draft_batch": [4, 3]}),
        "a subset of the verdict": (awaiting(), awaited, {"draft_batch": [3]}),
        "removes a row in flight": (awaiting(), awaited, {"remove": [1]}),
        "a row with a grammar": (grammar_row(), awaited, {}),
        "removes a row it drafts": (awaiting(), awaited, {"remove": [4]}),
        "a row awaits no verdict": (awaiting(s4=2), awaited, {}),
        "rows await proposals of different k": (awaiting(s4=6), awaited, {}),
    }
    for why, (worker, verdict_awaited, fields) in cases.items():
        plan = control_pb2.StepPlan(**{**plain, **fields})
        assert launchable_kd(worker, verdict_awaited, plan, [1, 2]) is None, why
