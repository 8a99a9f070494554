"""Greedy decoding: AR equals transformers, speculative equals AR token for token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from tests.conftest import engine_from_folders, make_hf_model

PROMPTS = [[5, 9, 13], [7] * 11, [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [42]]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def test_greedy_ar_equals_transformers_generate(tmp_path: Path) -> None:
    hf = make_hf_model(tmp_path, "llama", seed=5)
    engine = engine_from_folders(tmp_path, None, "ar", block_size=4, num_blocks=128)
    reqs = engine.generate(PROMPTS, greedy(24))
    for prompt, req in zip(PROMPTS, reqs, strict=True):
        ids = torch.tensor([prompt])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24,
                          min_new_tokens=24, pad_token_id=0)
        assert req.output_ids == ref[0, len(prompt):].tolist()


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_sd_equals_greedy_ar_on_random_pair(random_pair: tuple[Path, Path], k: int) -> None:
    target, draft = random_pair
    ar = engine_from_folders(target, None, "ar", block_size=4, num_blocks=256).generate(PROMPTS, greedy(30))
    sd_engine = engine_from_folders(target, draft, "sd", k=k, block_size=4, num_blocks=256)
    sd = sd_engine.generate(PROMPTS, greedy(30))
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert sd_engine.target.runner.allocator.num_free == 256
    assert sd_engine.draft is not None and sd_engine.draft.runner.allocator.num_free == 256


@pytest.mark.skipif(not (TINY_TARGET / "config.json").exists(), reason="bundled pair not built")
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_sd_equals_greedy_ar_on_bundled_pair(k: int) -> None:
    prompts = ["def main(argv):\n    ", "import os\nimport sys\n\n\nclass ", "    return self._", "x = "]
    ar = engine_from_folders(TINY_TARGET, None, "ar").generate(prompts, greedy(40))
    sd_engine = engine_from_folders(TINY_TARGET, TINY_DRAFT, "sd", k=k)
    sd = sd_engine.generate(prompts, greedy(40))
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert [r.text for r in sd] == [r.text for r in ar]
    assert sum(r.stats.accepted for r in sd) > 0


def test_sd_survives_preemption_with_exact_output(random_pair: tuple[Path, Path]) -> None:
    """A KV cache too small for the whole batch preempts and recomputes without changing tokens."""
    target, draft = random_pair
    ar = engine_from_folders(target, None, "ar", block_size=4, num_blocks=256).generate(PROMPTS, greedy(30))
    small = engine_from_folders(target, draft, "sd", k=3, block_size=4, num_blocks=16)
    sd = small.generate(PROMPTS, greedy(30))
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert small.target.runner.allocator.num_free == 16
