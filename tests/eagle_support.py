"""Synthetic EAGLE head folders in each published layout, for a target made by make_hf_model."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from minedraft.bundled import TINY_TARGET
from minedraft.cli.local_stack import LocalStack, StackConfig, free_port

LAYOUTS = ("safeailab-eagle", "safeailab-eagle3", "speculators-eagle", "speculators-eagle3")
TINY_EAGLE = TINY_TARGET.parent / "tiny-eagle"  # the bundled head trained for tiny-target
BUNDLED_PROMPTS = [[(7 * i + j) % 180 + 3 for j in range(4 + (5 * i) % 20)] for i in range(8)]


def bundled_head_stack(log_dir: Path, process_env: dict[str, dict[str, str]], draft_service: bool = True
                       ) -> LocalStack:
    """tiny-target's verifier (and a draft service) with the bundled head, started; the batch manager is the
    test's own (tests/conftest.serve_requests)."""
    stack = LocalStack(StackConfig(target=str(TINY_TARGET), draft=str(TINY_EAGLE), draft_kind="eagle",
                                   grpc_port=free_port(), http_port=free_port(), num_blocks=512, log_dir=log_dir,
                                   process_env=process_env))
    stack.start_verifier()
    if draft_service:
        stack.start_draft()
    return stack


def _layer(target: dict, version: int, prefix: str, gen: torch.Generator, scale: float) -> dict[str, torch.Tensor]:
    h, inter = target["hidden_size"], target["intermediate_size"]
    heads, kv = target["num_attention_heads"], target["num_key_value_heads"]
    d = h // heads
    width = 2 * h if version == 3 else h

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale / shape[-1] ** 0.5

    a = f"{prefix}self_attn."
    out = {f"{a}q_proj.weight": rnd(heads * d, width), f"{a}k_proj.weight": rnd(kv * d, width),
           f"{a}v_proj.weight": rnd(kv * d, width), f"{a}o_proj.weight": rnd(h, heads * d),
           f"{prefix}mlp.gate_proj.weight": rnd(inter, h), f"{prefix}mlp.up_proj.weight": rnd(inter, h),
           f"{prefix}mlp.down_proj.weight": rnd(h, inter),
           f"{prefix}post_attention_layernorm.weight": 1 + 0.1 * torch.randn(h, generator=gen)}
    if version == 3:
        out[f"{prefix}input_layernorm.weight"] = 1 + 0.1 * torch.randn(h, generator=gen)
        out[f"{prefix}hidden_norm.weight"] = 1 + 0.1 * torch.randn(h, generator=gen)
    return out


def write_eagle_head(folder: Path, target_dir: Path, layout: str, seed: int = 0, draft_vocab: int | None = None,
                     aux: list[int] | None = None, scale: float = 1.0) -> Path:
    """A random head for the target in target_dir; EAGLE-3 heads get a reduced vocabulary and a d2t map."""
    target = json.loads((target_dir / "config.json").read_text())
    gen = torch.Generator().manual_seed(seed)
    h, vocab = target["hidden_size"], target["vocab_size"]
    version = 3 if layout.endswith("eagle3") else 1
    layer_cfg = {k: target[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                        "num_key_value_heads", "rms_norm_eps", "vocab_size",
                                        "max_position_embeddings")}
    layer_cfg.update(model_type="llama", num_hidden_layers=1, hidden_act="silu", rope_theta=10000.0)
    speculators = layout.startswith("speculators")
    prefix = "layers.0." if speculators or version == 1 else "midlayer."
    if speculators and version == 1:
        prefix = "transformer."
    tensors = _layer(target, version, prefix, gen, scale)
    dv = draft_vocab or vocab
    if version == 1:
        fc = "fusion_fc" if speculators else "fc"
        tensors[f"{fc}.weight"] = torch.randn(h, 2 * h, generator=gen) * scale / (2 * h) ** 0.5
        if not speculators:
            tensors["fc.bias"] = 0.1 * torch.randn(h, generator=gen)
    else:
        taps = len(aux or [0, 1, 1])
        tensors["fc.weight"] = torch.randn(h, taps * h, generator=gen) * scale / (taps * h) ** 0.5
        tensors["norm.weight"] = 1 + 0.1 * torch.randn(h, generator=gen)
        tensors["lm_head.weight"] = torch.randn(dv, h, generator=gen) * 2.5 / h ** 0.5
        chosen = torch.sort(torch.randperm(vocab, generator=gen)[:dv]).values
        tensors["d2t"] = chosen - torch.arange(dv)
        tensors["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill(0, chosen, True)
    if speculators:
        config: dict = {"speculators_model_type": "eagle3" if version == 3 else "eagle",
                        "transformer_layer_config": layer_cfg, "architectures": ["Eagle3Speculator"]}
        if version == 3:
            config.update(draft_vocab_size=dv, norm_before_residual=False, target_hidden_size=h)
    else:
        config = {**layer_cfg, "architectures": ["LlamaForCausalLMEagle3" if version == 3 else "LlamaForCausalLM"]}
        if version == 3:
            config["draft_vocab_size"] = dv
    if version == 3:
        config["eagle_aux_hidden_state_layer_ids"] = aux or [0, 1, 1]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if layout.startswith("safeailab"):
        torch.save(tensors, folder / "pytorch_model.bin")  # as SafeAILab publishes its heads
    else:
        save_file(tensors, str(folder / "model.safetensors"))
    return folder
