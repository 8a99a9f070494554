"""The head's batched stash feeds the first forward what the one-sequence-at-a-time stash feeds, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minedraft.bench.synthetic_eagle import build_synthetic_head, head_runners
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.eagle_drafter import EagleDrafter
from minedraft.engine.eagle_pair import head_beside
from minedraft.engine.eagle_runner import EagleRunner
from minedraft.engine.eagle_stash import EagleStash
from minedraft.engine.hidden_rows import HiddenRows
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier
from tests.eagle_support import write_eagle_head
from tests.test_synthetic_eagle import DRAFT_VOCAB, generate, pair, prompts

PARAMS = SamplingParams(max_tokens=64, ignore_eos=True)
K = 3


class Recording:
    """Every features tensor a drafter's head forwards read, in order."""

    def __init__(self, drafter: EagleDrafter) -> None:
        self.features: list[torch.Tensor] = []
        forward = drafter.head_runner.forward_features

        def recorded(seq_ids, ids, features, *rest):  # type: ignore[no-untyped-def]
            self.features.append(features.detach().clone())
            return forward(seq_ids, ids, features, *rest)

        drafter.head_runner.forward_features = recorded  # type: ignore[method-assign]


def script(drafter: EagleDrafter, width: int) -> list[list[int]]:
    """Commits of varying accepted counts, a prefill run, a gap the target's prefix cache skipped, verdicts
    piling up between proposals, steps that draft nothing, a sequence removed and another added in its slot, one
    removed and added again, one without states."""
    gen = torch.Generator().manual_seed(7)

    def states(n: int) -> torch.Tensor:
        return torch.randn(n, width, generator=gen)

    def tokens(n: int) -> list[int]:
        return torch.randint(2, 90, (n,), generator=gen).tolist()

    drafts: list[list[int]] = []
    drafter.add(1, tokens(20), PARAMS)
    drafter.add(2, tokens(5), PARAMS)
    drafter.add(3, tokens(12), PARAMS)
    drafts += drafter.propose([1, 2, 3], K).tokens.tolist()  # no states yet: zeros, uncached
    live = [1, 2, 3]
    first = {1: 0, 2: 0, 3: 8}  # sequence 3's target held positions 0..7 in its prefix cache
    lengths = {s: drafter.seqs[s].length for s in live}
    drafter.commit_batch(live, [tokens(1) for _ in live], [0] * 3,
                         HiddenRows([first[s] for s in live], [lengths[s] - first[s] for s in live],
                                    states(sum(lengths[s] - first[s] for s in live))))
    for step in range(14):
        if step == 5:  # sequence 1 leaves, 4 arrives (in its slot) and drafts before its first verdict
            drafter.remove(1)
            drafter.add(4, tokens(9), PARAMS)
            live = [4, 2, 3]
            drafts += drafter.propose([4], K).tokens.tolist()
            drafter.commit(4, tokens(1), 0, (0, states(9)))
        if step == 11:  # sequence 3 leaves and comes back: nothing of its old states is fed
            drafter.remove(3)
            drafter.add(3, tokens(7), PARAMS)
        proposing = [s for s in live if not (s == 2 and 6 <= step <= 10)]  # 2 sits out: its verdicts pile up
        if step in (8, 9):  # steps that draft nothing (AR steps): two verdicts with no read between them
            proposing = []
        if proposing:
            drafts += drafter.propose(proposing, K).tokens.tolist()
        ends = [drafter.seqs[s].length - 1 for s in live]
        accepted = [int(a) for a in torch.randint(0, K + 1, (len(live),), generator=gen)]
        window = [K + 1 if s in proposing else 1 for s in live]
        new = [tokens(a + 1 if s in proposing else 1) for s, a in zip(live, accepted, strict=True)]
        drafter.commit_batch(live, new, accepted, HiddenRows(ends, window, states(sum(window))))
    drafts += drafter.propose(live, K).tokens.tolist()
    return drafts


@pytest.mark.parametrize("window", [2, 5, 16])
def test_the_window_feeds_what_the_per_sequence_stash_feeds(random_pair: tuple[Path, Path], tmp_path: Path,
                                                            window: int) -> None:
    target_dir, _ = random_pair
    head = write_eagle_head(tmp_path / "head", target_dir, "safeailab-eagle")
    target = load_model(target_dir)
    per_row = head_beside(target, head, 64, 16, "cpu", torch.float32)
    per_row.stash = EagleStash(per_row.feature_width, torch.float32, torch.device("cpu"), window=0)
    batched = head_beside(target, head, 64, 16, "cpu", torch.float32)
    batched.stash = EagleStash(batched.feature_width, torch.float32, torch.device("cpu"), window=window, slots=1)
    seen = Recording(per_row), Recording(batched)
    assert script(per_row, per_row.feature_width) == script(batched, batched.feature_width)
    assert len(seen[0].features) == len(seen[1].features) > 20
    assert all(torch.equal(a, b) for a, b in zip(*(s.features for s in seen), strict=True))
    assert any(bool((f != 0).any()) and bool((f == 0).all(-1).any()) for f in seen[1].features)  # states and zeros
    assert batched.stash.slot_of  # the steady spans went back to the window
    assert per_row.features_received == batched.features_received


def test_a_prefill_run_is_fed_as_committed_and_a_prefix_gap_as_zeros(random_pair: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    target_dir, _ = random_pair
    head = write_eagle_head(tmp_path / "head", target_dir, "safeailab-eagle")
    drafter = head_beside(load_model(target_dir), head, 64, 16, "cpu", torch.float32)
    seen = Recording(drafter)
    drafter.add(1, list(range(2, 22)), PARAMS)
    run = torch.randn(12, drafter.feature_width)
    drafter.commit(1, [30], 0, (8, run))  # positions 0..7 were the target's prefix cache: never computed
    drafter.propose([1], K)
    fed = seen.features[0][0]
    assert fed.shape[0] == 20  # pairs 0..19 of the 21 tokens
    assert torch.equal(fed[:8], torch.zeros(8, drafter.feature_width)) and torch.equal(fed[8:], run)
    assert drafter.seqs[1].cached == 20


def test_the_stash_keeps_the_heads_dtype() -> None:
    stash = EagleStash(4, torch.bfloat16, torch.device("cpu"), window=4)
    stash.put(1, 0, 0, torch.randn(3, 4))
    assert stash.gather([1], [0], [3], 3).dtype == torch.bfloat16 and stash.buffer.dtype == torch.bfloat16


@pytest.mark.parametrize("window", [1, 3])
def test_greedy_sd_through_a_small_window_equals_ar(window: int) -> None:
    target, _ = pair(0.7)
    head = build_synthetic_head(target, 0.7, DRAFT_VOCAB)
    ar = generate(Verifier(ModelRunner(target, 128, 16, "cpu")), None, prompts())
    capture, _ = head_runners(target, head, 128)
    drafter = EagleDrafter(EagleRunner(head, 128, 16, "cpu"), window=window)
    sd = generate(Verifier(capture), drafter, prompts(), K)
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert sum(r.stats.accepted for r in sd) > 0
