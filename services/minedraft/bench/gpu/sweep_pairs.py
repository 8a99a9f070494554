"""What one level of the placement sweep drafts with: the synthetic target in a weight format, and a draft
model or a synthetic EAGLE-3 head of it, with the prompts that suit that drafter.

- weights: `bf16`, or `fp8` / `fp8-channel` (the target's projections quantized in memory by each service
  that builds it, `SyntheticSpec.fp8`); the draft model stays bf16, as a checkpoint's draft has its own config.
- drafter: `model` (the pair's draft model: the target's first layers) or `eagle` (a head built from the
  target's embedding, `bench/synthetic_eagle.py`, written to a folder the services load; its draft service
  builds what the head shares with the synthetic target itself). The head's prompts are drawn from the
  tokens whose greedy path stays inside its reduced vocabulary, so its acceptance is its agreement's.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open

from minedraft.bench.fp8_quantizer import WEIGHT_FORMATS
from minedraft.bench.gpu.step_report import ModelBytes
from minedraft.bench.synthetic_pair import SHAPES, SyntheticSpec, full_parameter_shapes
from minedraft.bench.workload import random_prompts
from minedraft.engine.config import ModelConfig
from minedraft.engine.fp8_weights import PROJECTIONS

DRAFTERS = ("model", "eagle")
PROMPT_LEN = 32


@dataclass(frozen=True, slots=True)
class LevelPair:
    target: str  # the target's synthetic spec
    draft: str  # the draft model's spec, or the EAGLE head's folder
    draft_kind: str  # "model" | "eagle" (StackConfig.draft_kind)
    prompts: list[list[int]]


def level_pair(shape: str, alpha: float, draft_layers: int, agree: float, weights: str, drafter: str, count: int,
               draft_vocab: int, head_device: str = "cuda:0", seed: int = 13) -> LevelPair:
    """The level's pair and `count` prompts. An EAGLE head is built on `head_device` (the device type the target's
    services build on, so that it reads the same embedding) and written to a fresh folder."""
    if weights not in WEIGHT_FORMATS or drafter not in DRAFTERS:
        raise ValueError(f"weights {weights!r} (one of {', '.join(WEIGHT_FORMATS)}), drafter {drafter!r} "
                         f"(one of {', '.join(DRAFTERS)})")
    target, draft = SyntheticSpec(shape, "target", alpha, draft_layers, agree).pair()
    target = replace(target, fp8=WEIGHT_FORMATS[weights])
    if drafter == "model":
        ids = min(2000, SHAPES[shape].vocab_size)  # the 8B shape's prompts as the sweep always drew them
        return LevelPair(str(target), str(draft), "model", random_prompts(count, PROMPT_LEN, seed=seed, high=ids))
    from minedraft.bench.synthetic_eagle import head_prompts, head_vocabulary, write_synthetic_head

    folder = Path(tempfile.mkdtemp(prefix="minedraft_eagle_head_"))
    write_synthetic_head(target, agree, draft_vocab, folder, head_device, torch.bfloat16)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the services get the GPU's memory back
    closed = head_vocabulary(SHAPES[shape].vocab_size, draft_vocab, 0).closed
    return LevelPair(str(target), str(folder), "eagle", head_prompts(closed, count, PROMPT_LEN, seed=seed))


def level_bytes(pair: LevelPair, shape: str, draft_layers: int) -> tuple[ModelBytes, ModelBytes]:
    """What one forward of the level's target and of its drafter reads (bench/gpu/step_report.ModelBytes): every
    weight but the embedding (whose rows a step gathers), FP8 projections at a byte per weight plus their float32
    block or row scales, and the KV bytes per attended position. A head reads its folder's tensors."""
    target = SyntheticSpec.parse(pair.target)
    full = SHAPES[shape]
    kv = (full.num_kv_heads, full.head_dim, 2)  # bf16 cache
    target_bytes = ModelBytes.of(_weight_bytes(full, target.fp8), full.num_layers, *kv)
    if pair.draft_kind == "eagle":  # one decoder layer
        with safe_open(str(Path(pair.draft) / "model.safetensors"), "pt") as f:
            head = sum(math.prod(f.get_slice(n).get_shape()) * 2 for n in f.keys() if n not in ("d2t", "t2d"))  # noqa: SIM118
        return target_bytes, ModelBytes.of(head, 1, *kv)
    return target_bytes, ModelBytes.of(_weight_bytes(replace(full, num_layers=draft_layers), ""), draft_layers, *kv)


def _weight_bytes(cfg: ModelConfig, fp8: str) -> int:
    total = 0
    for name, shape in full_parameter_shapes(cfg):
        if name == "model.embed_tokens.weight":
            continue
        module = name.removesuffix(".weight").rsplit(".", 1)[-1]
        if fp8 and module in PROJECTIONS:
            scales = shape[0] if fp8 == "channel" else -(-shape[0] // 128) * -(-shape[1] // 128)
            total += shape.numel() + 4 * scales
        else:
            total += 2 * shape.numel()
    return total
