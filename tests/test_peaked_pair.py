"""The synthetic pair's peaked heads (`:agree=A`): wide greedy margins, so SD equals AR in bf16, and a
greedy acceptance near A without calibration."""

from __future__ import annotations

import statistics

import pytest
import torch

from minedraft.bench.peaked_head import successors
from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic
from minedraft.bundled import TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.drafter import Drafter
from minedraft.engine.llm_engine import EngineConfig, LLMEngine
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier

PROMPTS = [[(37 * i + 11 * j) % 500 + 3 for j in range(5 + i % 4)] for i in range(8)]


def test_spec_carries_agree_and_old_specs_stay_as_they_were() -> None:
    spec = SyntheticSpec("llama3-8b", "target", 0.02, 4, 0.7)
    assert str(spec) == "synthetic:llama3-8b:target:alpha=0.02:draft_layers=4:agree=0.7"
    assert SyntheticSpec.parse(str(spec)) == spec
    assert str(SyntheticSpec("tiny", "draft", 0.3, 2)) == "synthetic:tiny:draft:alpha=0.3:draft_layers=2"


def test_draft_successors_agree_with_the_target_on_the_chosen_share() -> None:
    target = successors(20000, False, 0.7, 0, torch.device("cpu"))
    draft = successors(20000, True, 0.7, 0, torch.device("cpu"))
    assert sorted(target.tolist()) == list(range(20000))  # a permutation
    assert abs((target == draft).float().mean().item() - 0.7) < 0.02
    assert torch.equal(successors(20000, True, 0.7, 0, torch.device("cpu")), draft)  # same in every process


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_choice_is_the_successor_with_a_wide_margin(dtype: torch.dtype) -> None:
    model = build_synthetic(SyntheticSpec("tiny", "target", 0.02, 2, 0.7), "cpu", dtype)
    prompt = PROMPTS[3] * 4
    logits = ModelRunner(model, 16, 16).forward([0], [prompt], [0], last_n=len(prompt))[0].float()
    top2 = logits.topk(2, dim=-1)
    pi = successors(512, False, 0.7, 0, torch.device("cpu"))
    assert torch.equal(top2.indices[:, 0], pi[torch.tensor(prompt)])
    assert (top2.values[:, 0] - top2.values[:, 1]).min().item() > 1.0  # far above bf16's resolution here


def engine(agree: float, mode: str) -> LLMEngine:
    dtype = torch.bfloat16
    target = Verifier(ModelRunner(build_synthetic(SyntheticSpec("tiny", "target", 0.02, 2, agree), "cpu", dtype), 256))
    draft = Drafter(ModelRunner(build_synthetic(SyntheticSpec("tiny", "draft", 0.02, 2, agree), "cpu", dtype), 256))
    return LLMEngine(target, draft if mode == "sd" else None, Tokenizer(TINY_TARGET),
                     EngineConfig(mode=mode, k=4, dtype=dtype))


@pytest.mark.parametrize("agree", [0.5, 0.9])
def test_sd_equals_ar_in_bf16_and_acceptance_follows_agree(agree: float) -> None:
    params = [SamplingParams(max_tokens=48, ignore_eos=True) for _ in PROMPTS]
    ar = [r.output_ids for r in engine(agree, "ar").generate(PROMPTS, params)]
    reqs = engine(agree, "sd").generate(PROMPTS, params)
    assert [r.output_ids for r in reqs] == ar
    acceptance = statistics.fmean(r.stats.accepted / r.stats.drafted for r in reqs)
    # Conditional on reaching position i, each draft is right with probability ~agree; a verify
    # judges k drafts only while they are right, so accepted/drafted sits below agree.
    expected = sum(agree ** (i + 1) for i in range(4)) / 4
    assert abs(acceptance - expected) < 0.12
