"""Structured outputs on the CUDA path: the bundled tiny pair's JSON-schema outputs parse and validate in AR
and SD (Triton attention, CUDA graphs where the shapes allow), and greedy SD agrees with greedy AR. CI has no
GPU; scripts/device_structured.sh runs these on one."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.structured import StructuredOutput
from minedraft.engine.llm_engine import EngineConfig, LLMEngine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "kind": {"enum": ["a", "b"]}},
          "required": ["name", "n", "kind"], "additionalProperties": False}
PROMPTS = ["A record: ", "def main():\n", "JSON:", "x = "] * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_schema_outputs_validate_and_greedy_sd_agrees_with_ar_on_cuda(dtype: torch.dtype) -> None:
    so = StructuredOutput("json_schema", json.dumps(SCHEMA))
    outputs = {}
    for mode in ("ar", "sd"):
        engine = LLMEngine.from_folders(TINY_TARGET, TINY_DRAFT, EngineConfig(mode=mode, k=4, device="cuda:0",
                                                                             dtype=dtype))
        greedy = engine.generate(PROMPTS, [SamplingParams(max_tokens=80, structured=so) for _ in PROMPTS])
        sampled = engine.generate(PROMPTS, [SamplingParams(max_tokens=80, temperature=0.8, seed=s, structured=so)
                                            for s in range(len(PROMPTS))])
        for req in greedy + sampled:
            jsonschema.validate(json.loads(req.text), SCHEMA)
        outputs[mode] = [r.output_ids for r in greedy]
    agree = sum(a == b for a, b in zip(outputs["ar"], outputs["sd"], strict=True)) / len(PROMPTS)
    assert agree == 1.0 if dtype == torch.float32 else agree >= 0.9
