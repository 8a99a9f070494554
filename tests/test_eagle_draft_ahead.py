"""An EAGLE head drafting from a verdict still on the device (engine/eagle_ahead.py).

The ahead path must leave the head's drafter exactly where `commit` (with the verdict's states) followed by
`propose` leaves it: the same drafts and draft distributions, the same committed tokens, cached positions,
stash spans and KV blocks, for every accepted count from 0 to kd and with k changing between steps; and it
is taken only where the verdict will carry exactly the verify window's states. The service path runs in
tests/test_eagle_launch_ahead.py; the CUDA-graph replay of the first forward, with its starts and lengths on the
device, in tests/gpu/test_eagle_draft_ahead_on_cuda.py."""

from __future__ import annotations

import pytest
import torch

from minedraft.bundled import TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine import eagle_ahead
from minedraft.engine.eagle_drafter import EagleDrafter
from minedraft.engine.eagle_pair import head_drafter
from tests.eagle_support import TINY_EAGLE
from tests.test_draft_ahead import verdict

PROMPTS = {11: [5, 9, 3], 12: [7, 7, 8, 2, 40, 41, 42], 13: [60, 61], 14: [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]}
PARAMS = {11: SamplingParams(max_tokens=64), 12: SamplingParams(max_tokens=64, temperature=0.8, seed=3),
          13: SamplingParams(max_tokens=64), 14: SamplingParams(max_tokens=64, temperature=1.3, top_k=20, seed=9)}

pytestmark = pytest.mark.skipif(not (TINY_EAGLE / "config.json").exists(), reason="bundled head not built")


def drafter(device: str = "cpu") -> EagleDrafter:
    d = head_drafter(TINY_EAGLE, TINY_TARGET, 128, 4, device, torch.float32)
    if device != "cpu":
        d.head_runner.capture_ahead(len(PROMPTS), 4)  # the first forwards of every width replay their graphs
    for seq_id, prompt in PROMPTS.items():
        d.add(seq_id, prompt, PARAMS[seq_id])
    return d


def states(d: EagleDrafter, rows: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(rows, d.feature_width, generator=gen).to(d.runner.device)


def first_verdict(d: EagleDrafter, ids: list[int], rows: torch.Tensor, accepted: list[int], prompt_states: dict
                  ) -> None:
    """The first verdict: each row's prompt states and its window's, from position 0."""
    for seq_id, row, n in zip(ids, rows.tolist(), accepted, strict=True):
        d.commit(seq_id, row[: n + 1], n, (0, prompt_states[seq_id]))


def head_ahead_against_host(device: str = "cpu") -> float:
    """Both paths over rounds that give every row every accepted count 0..kd, with k changing; asserts identical
    bookkeeping and returns the share of identical drafts."""
    host, ahead = drafter(device), drafter(device)
    ids, gen, kd = list(PROMPTS), torch.Generator().manual_seed(4), 3
    same = total = 0
    drafts = host.propose(ids, kd).tokens
    ahead.propose(ids, kd)
    assert not eagle_ahead.can_draft_ahead(host, ids), "no state has come yet: the first verdict brings them"
    rows = verdict(drafts, [1, 0, 3, 2], 0)
    prompt_states = {s: states(host, len(PROMPTS[s]) + kd, gen) for s in ids}  # positions 0 .. L + kd - 1
    for d in (host, ahead):
        first_verdict(d, ids, rows, [1, 0, 3, 2], prompt_states)
    drafts = host.propose(ids, kd).tokens
    ahead.propose(ids, kd)
    schedule = [([0, 3, 1, 2], 3), ([3, 0, 2, 1], 4), ([4, 4, 0, 3], 2), ([1, 2, 2, 0], 1), ([1, 0, 1, 1], 3)]
    for step, (accepted, k) in enumerate(schedule):
        assert eagle_ahead.can_draft_ahead(ahead, ids) and all(eagle_ahead.awaited_k(ahead, s) == kd for s in ids)
        rows = verdict(drafts, accepted, step + 1)
        window = states(host, len(ids) * (kd + 1), gen)  # positions L-1 .. L+kd-1 of each row
        for b, (seq_id, row, n) in enumerate(zip(ids, rows.tolist(), accepted, strict=True)):
            rows_b = window[b * (kd + 1) : (b + 1) * (kd + 1)]
            host.commit(seq_id, row[: n + 1], n, (host.seqs[seq_id].length - 1, rows_b))
        want = host.propose(ids, k)
        on_device = ahead.runner.to_device
        got = eagle_ahead.propose_ahead(ahead, ids, kd, k, on_device(torch.tensor(accepted)), on_device(rows), window)
        eagle_ahead.settle(ahead, ids, rows.tolist(), accepted, k, window)
        same += int((got.tokens == want.tokens).sum())
        total += want.tokens.numel()
        assert got.probs is not None and want.probs is not None and got.probs.shape == want.probs.shape
        if device == "cpu":  # one reduction order: the same distributions to rounding
            torch.testing.assert_close(got.probs, want.probs)
        for seq_id in ids:
            h, a = host.seqs[seq_id], ahead.seqs[seq_id]
            assert (a.tokens, a.cached) == (h.tokens, h.cached), f"round {step}, sequence {seq_id}"
            assert ahead.stash.span(seq_id) == host.stash.span(seq_id)
            # its KV blocks hold every position it fed (the worst case's, reserved before the verdict was known)
            assert len(ahead.runner.allocator.table(seq_id)) * 4 >= a.length + k - 2
        assert ahead.features_received == host.features_received
        drafts, kd = want.tokens, k
    # the stashed states themselves: the next ordinary proposal of both reads the same features
    nxt = verdict(drafts, [0] * len(ids), 9)
    for d in (host, ahead):
        for seq_id, row in zip(ids, nxt.tolist(), strict=True):
            d.commit(seq_id, row[:1], 0)  # no states this time: the re-fed newest one comes from the stash
    last = ahead.propose(ids, 2).tokens == host.propose(ids, 2).tokens
    assert ahead.runner.allocator.num_free == host.runner.allocator.num_free  # the worst case's blocks went back
    return (same + int(last.sum())) / (total + last.numel())


def test_head_drafts_from_a_device_verdict_equal_commit_then_propose() -> None:
    assert head_ahead_against_host() == 1.0  # on the CPU: token for token


def test_a_row_missing_states_before_its_window_keeps_the_ordinary_path() -> None:
    d = drafter()
    ids, gen = list(PROMPTS), torch.Generator().manual_seed(5)
    drafts = d.propose(ids, 2).tokens
    rows = verdict(drafts, [2, 1, 0, 2], 0)
    prompt_states = {s: states(d, len(PROMPTS[s]) + 2, gen) for s in ids}
    prompt_states[13] = prompt_states[13][:1]  # the target computed only position 0 of it (a prefix hit)
    first_verdict(d, ids, rows, [2, 1, 0, 2], prompt_states)
    d.propose(ids, 2)
    assert not eagle_ahead.can_draft_ahead(d, ids)
    assert eagle_ahead.can_draft_ahead(d, [11, 12, 14])
    d.remove(12)
    assert eagle_ahead.awaited_k(d, 12) == 0
