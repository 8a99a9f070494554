"""EAGLE drafting on the GPU path (Triton attention, bfloat16): greedy SD with a head equals AR token for token,
for the bundled EAGLE-1 head and the synthetic EAGLE-3 head, whose acceptance is the draft model's at the same
agreement (CUDA only; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

from minedraft.bench.synthetic_eagle import build_synthetic_head, head_prompts, head_runners, head_vocabulary
from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic
from minedraft.bundled import TINY_EAGLE, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.drafter import Drafter
from minedraft.engine.llm_engine import EngineConfig, LLMEngine, Request
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier
from tests.conftest import engine_from_folders

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PARAMS = SamplingParams(max_tokens=48, ignore_eos=True)


@pytest.mark.skipif(not (TINY_EAGLE / "config.json").exists(), reason="bundled head not built")
def test_the_bundled_head_on_cuda_equals_ar() -> None:
    prompts = ["def main(argv):\n    ", "import os\nimport sys\n\n\nclass ", "    return self._", "x = "]
    ar = engine_from_folders(TINY_TARGET, None, "ar", device="cuda", dtype=torch.bfloat16).generate(prompts, PARAMS)
    sd = engine_from_folders(TINY_TARGET, TINY_EAGLE, "sd", k=4, draft_kind="eagle", device="cuda",
                             dtype=torch.bfloat16).generate(prompts, PARAMS)
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert sum(r.stats.accepted for r in sd) > 0


def _generate(target: Verifier, drafter: Drafter | None, prompts: list[list[int]], k: int) -> list[Request]:
    cfg = EngineConfig(mode="sd" if drafter is not None else "ar", k=k, max_num_seqs=len(prompts), device="cuda")
    return LLMEngine(target, drafter, Tokenizer(TINY_TARGET), cfg).generate(prompts, PARAMS)


def test_the_synthetic_head_on_cuda_equals_ar_and_accepts_as_the_draft_model() -> None:
    target_spec, draft_spec = SyntheticSpec("tiny", "target", draft_layers=2, agree=0.7).pair()
    target = build_synthetic(target_spec, "cuda", torch.bfloat16)
    draft = build_synthetic(draft_spec, "cuda", torch.bfloat16)
    head = build_synthetic_head(target, 0.7, 256)
    prompts = head_prompts(head_vocabulary(512, 256, 0).closed, 16, 24, seed=5)
    ar = _generate(Verifier(ModelRunner(target, 512, 16, "cuda")), None, prompts, 1)
    accepted = {}
    for k in (1, 4, 6):
        capture, drafter = head_runners(target, head, 512)
        sd = _generate(Verifier(capture), drafter, prompts, k)
        assert [r.output_ids for r in sd] == [r.output_ids for r in ar], k
        accepted[k] = sum(r.stats.accepted for r in sd) / sum(r.stats.drafted for r in sd)
    model = _generate(Verifier(ModelRunner(target, 512, 16, "cuda")), Drafter(ModelRunner(draft, 512, 16, "cuda")),
                      prompts, 4)
    assert [r.output_ids for r in model] == [r.output_ids for r in ar]
    by_model = sum(r.stats.accepted for r in model) / sum(r.stats.drafted for r in model)
    assert abs(accepted[4] - by_model) <= 0.05
