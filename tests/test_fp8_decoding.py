"""Greedy SD with an FP8 target equals AR with the same FP8 target (lossless relative to the FP8
model, not to bf16), with a bf16 draft and with an FP8 draft of its own layout; the FP8 model still
predicts like the model it was quantized from."""

from __future__ import annotations

from pathlib import Path

import pytest

from minedraft.bench.fp8_quantizer import write_fp8_checkpoint
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from tests.conftest import engine_from_folders

PROMPTS = ["def main(argv):\n    ", "import os\nimport sys\n\n\nclass ", "    return self._", "x = "]


@pytest.fixture(scope="module")
def fp8_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fp8pair")
    return {"block": write_fp8_checkpoint(TINY_TARGET, root / "target-block", "block"),
            "channel": write_fp8_checkpoint(TINY_TARGET, root / "target-channel", "channel"),
            "draft": write_fp8_checkpoint(TINY_DRAFT, root / "draft-channel", "channel")}


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


@pytest.mark.parametrize("scheme, fp8_draft", [("block", False), ("channel", True)], ids=["block", "channel+fp8-draft"])
def test_greedy_sd_with_an_fp8_target_equals_ar_with_it(fp8_pair: dict[str, Path], scheme: str,
                                                        fp8_draft: bool) -> None:
    target = fp8_pair[scheme]
    draft = fp8_pair["draft"] if fp8_draft else TINY_DRAFT
    ar = engine_from_folders(target, None, "ar").generate(PROMPTS, greedy(24))
    sd = engine_from_folders(target, draft, "sd", k=3).generate(PROMPTS, greedy(24))
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert sum(r.stats.accepted for r in sd) > 0


def test_an_fp8_target_predicts_what_its_bf16_source_does(fp8_pair: dict[str, Path]) -> None:
    tokens = [5, 9, 13, 200, 31, 7, 1000, 42, 3, 77, 500, 12]
    logits = {}
    for name, folder in (("dense", TINY_TARGET), ("block", fp8_pair["block"]), ("channel", fp8_pair["channel"])):
        logits[name] = ModelRunner(load_model(folder), 16, 4).forward([0], [tokens], [0], last_n=len(tokens))[0]
    for scheme in ("block", "channel"):
        rel = float((logits[scheme] - logits["dense"]).norm() / logits["dense"].norm())
        agree = float((logits[scheme].argmax(-1) == logits["dense"].argmax(-1)).float().mean())
        assert rel < 0.05 and agree >= 0.75, (scheme, rel, agree)
