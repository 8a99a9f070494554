"""In-process SD with TETRIS selection: greedy output equals AR, the packed forward equals the padded one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.ragged import packed_forward
from minedraft.engine.runner import ModelRunner
from tests.conftest import engine_from_folders, load_model
from tests.test_decoding import PROMPTS, greedy
from tests.test_lossless_sampling import SAMPLES, chi_square_pvalue, joint_first_two, sample_pairs, tiny_vocab_pair

__all__ = ["tiny_vocab_pair"]  # a fixture: imported to be found


@pytest.mark.parametrize(("k", "extra", "floor"), [(1, 3, 0.0), (3, 3, 0.0), (4, 2, 0.0), (3, 0, 0.02), (3, 2, 0.02)],
                         ids=["1+3", "3+3", "4+2", "3+0-floor", "3+2-floor"])
def test_greedy_tetris_sd_equals_ar(random_pair: tuple[Path, Path], k: int, extra: int, floor: float) -> None:
    """A floor (tetris_min_prob) prunes with or without extra drafts; rows still verify to ragged depths."""
    target, draft = random_pair
    ar = engine_from_folders(target, None, "ar", block_size=4, num_blocks=256).generate(PROMPTS, greedy(30))
    engine = engine_from_folders(target, draft, "sd", k=k, block_size=4, num_blocks=256, tetris_extra=extra,
                                 tetris_min_prob=floor)
    sd = engine.generate(PROMPTS, greedy(30))
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert engine.target.runner.allocator.num_free == 256
    assert engine.draft is not None and engine.draft.runner.allocator.num_free == 256
    drafted = [r.stats.drafted for r in sd]
    assert sum(drafted) <= k * sum(r.stats.steps for r in sd)  # the budget: k x batch per step
    assert len(set(drafted)) > 1  # rows were verified to different depths
    if floor:  # the random draft is unsure of everything (max q a few %): the floor cuts below the budget
        assert 0 < sum(drafted) < k * sum(r.stats.steps for r in sd)
    # every step selected on the device under a capacity set before it drafted, read back after its verdict
    assert engine.capacity.steps == engine.total_steps and engine.capacity.wanted is not None


@pytest.mark.skipif(not (TINY_TARGET / "config.json").exists(), reason="bundled pair not built")
def test_greedy_tetris_on_the_bundled_pair_with_penalties_and_logprobs() -> None:
    prompts = ["def main(argv):\n    ", "import os\nimport sys\n\n\nclass ", "    return self._", "x = "]
    params = [SamplingParams(max_tokens=40, ignore_eos=True, logprobs=2, repetition_penalty=1.2),
              SamplingParams(max_tokens=40, ignore_eos=True, presence_penalty=0.5, frequency_penalty=0.3),
              SamplingParams(max_tokens=40, ignore_eos=True, prompt_logprobs=1), greedy(40)]
    ar = engine_from_folders(TINY_TARGET, None, "ar").generate(prompts, params)
    sd = engine_from_folders(TINY_TARGET, TINY_DRAFT, "sd", k=3, tetris_extra=3).generate(prompts, params)
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    for a, s in zip(ar, sd, strict=True):
        if a.logprobs is not None:
            assert [e.token_id for e in s.logprobs] == [e.token_id for e in a.logprobs]
            assert [e.logprob for e in s.logprobs] == pytest.approx([e.logprob for e in a.logprobs], abs=1e-4)
        if a.prompt_logprobs is not None:
            assert [e.logprob if e else None for e in s.prompt_logprobs] == pytest.approx(
                [e.logprob if e else None for e in a.prompt_logprobs], abs=1e-4)
    assert sum(r.stats.accepted for r in sd) > 0


def test_packed_forward_equals_padded_forward(random_pair: tuple[Path, Path]) -> None:
    """Same logits at every valid slot: the layers on packed rows compute what they compute padded."""
    target, _ = random_pair
    padded, packed = (ModelRunner(load_model(target), 64, 4) for _ in range(2))
    prompts = [[5, 9, 13, 2], [7] * 9, [3, 4]]
    for runner in (padded, packed):
        for seq_id, prompt in enumerate(prompts):
            runner.forward([seq_id], [prompt], [0], last_n=1)
    lengths = [3, 0, 2]
    window = [[1, 2, 3], [6, 0, 0], [8, 9, 0]]  # each row's last token, then its drafts
    starts = [len(p) for p in prompts]
    ids = torch.tensor([[p[-1], *w] for p, w in zip(prompts, window, strict=True)])
    query_lens = [1 + n for n in lengths]
    ref = padded.forward_ids([0, 1, 2], ids, starts, query_lens, last_n=4)  # right-aligned
    got = packed_forward(packed, [0, 1, 2], ids, starts, [1, 1, 1], lengths, 4, sum(query_lens))  # left-aligned
    for b, n in enumerate(lengths):
        torch.testing.assert_close(got[b, : n + 1], ref[b, 4 - (n + 1):], rtol=1e-5, atol=1e-5)


def test_sampled_tetris_sd_follows_the_target_distribution(tiny_vocab_pair) -> None:
    target, draft, hf = tiny_vocab_pair
    probs = joint_first_two(hf, 1.0, 0, 1.0)
    engine = engine_from_folders(target, draft, "sd", k=1, block_size=8, num_blocks=SAMPLES + 64,
                                 max_num_seqs=SAMPLES, tetris_extra=2)
    counts = sample_pairs(engine, 1.0, 0, 1.0)
    assert chi_square_pvalue(counts, probs) > 1e-3


@pytest.mark.skipif(not (TINY_TARGET / "config.json").exists(), reason="bundled pair not built")
@pytest.mark.parametrize(("draft_kind", "extra"), [("model", 3), ("eagle", 0), ("eagle", 3)],
                         ids=["tetris", "head", "head-tetris"])
def test_greedy_tetris_with_grammars_equals_ar(draft_kind: str, extra: int) -> None:
    """Grammar rows mask each verified slot after drafts[:i]; a pruned row's -1 slots are never consumed. The
    same with the bundled EAGLE head drafting (its drafts masked as the draft model's are)."""
    from tests.test_structured_outputs import PROMPTS as TEXTS
    from tests.test_structured_outputs import SCHEMA, structured

    cases = [structured("json_schema", SCHEMA), structured("regex", r"[0-9]{3}-[a-z]{2,4}"),
             structured("choice", ["yes", "no", "maybe not"])]
    params = [SamplingParams(max_tokens=80, structured=so) for so in cases for _ in TEXTS]
    prompts = [p for _ in cases for p in TEXTS]
    ar = engine_from_folders(TINY_TARGET, None, "ar").generate(prompts, params)
    draft = TINY_DRAFT if draft_kind == "model" else TINY_TARGET.parent / "tiny-eagle"
    sd = engine_from_folders(TINY_TARGET, draft, "sd", k=3, tetris_extra=extra, draft_kind=draft_kind).generate(
        prompts, [SamplingParams(max_tokens=80, structured=p.structured) for p in params])
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
