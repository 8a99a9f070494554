"""What an EAGLE head folder's `config.json` says, in either published layout.

Two layouts ship heads for Llama 3.x and Qwen3 targets:
- SafeAILab's (EAGLE-1/2: a one-layer `LlamaForCausalLM` config whose weights add `fc`; EAGLE-3: an
  `...Eagle3` architecture or a `draft_vocab_size`, the layer under `midlayer.`);
- the `speculators` layout vLLM reads: `speculators_model_type` "eagle" or "eagle3", the decoder
  layer's settings under `transformer_layer_config`.
The layout is told from the config alone, so a wrong folder fails before any weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minedraft.core.errors import ModelLoadError
from minedraft.engine.config import ModelConfig, model_config_from_dict, read_config_json


@dataclass(frozen=True, slots=True)
class EagleConfig:
    """An EAGLE head: its one decoder layer's shape and what it reads from the target."""

    version: int  # 1: EAGLE-1/2 (the target's last hidden state); 3: EAGLE-3 (three layers' residual inputs)
    layout: str  # "safeailab" or "speculators"
    layer: ModelConfig  # the head's decoder layer (num_layers 1); vocab_size is the target's
    draft_vocab_size: int  # EAGLE-3's own head; the target's vocabulary for EAGLE-1
    fc_bias: bool
    aux_layers: tuple[int, ...]  # EAGLE-3: target layers whose residual-stream inputs are concatenated
    norm_before_residual: bool  # EAGLE-3: the residual is the normed hidden state (speculators' default)
    target_hidden_size: int

    @property
    def feature_width(self) -> int:
        """Width of what the verifier ships per position: h, or 3h for EAGLE-3 (fc runs on the draft)."""
        return self.target_hidden_size * (len(self.aux_layers) if self.version == 3 else 1)


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's usual taps: the inputs of layers 2, L/2 and L-3 (SafeAILab's and vLLM's choice)."""
    return (2, num_layers // 2, max(num_layers - 3, 0))


def _layer_config(raw: dict[str, Any], target: ModelConfig) -> ModelConfig:
    layer = dict(raw)
    layer.update(architectures=[], model_type=layer.get("model_type") if layer.get("model_type") in
                 ("llama", "qwen2", "qwen3", "mistral") else "llama", num_hidden_layers=1)
    layer.setdefault("vocab_size", target.vocab_size)
    layer.setdefault("max_position_embeddings", target.max_position_embeddings)
    cfg = model_config_from_dict(layer)
    if cfg.vocab_size != target.vocab_size:
        raise ModelLoadError(f"EAGLE head vocabulary {cfg.vocab_size} is not the target's {target.vocab_size}")
    return cfg


def eagle_config_from_dict(raw: dict[str, Any], target: ModelConfig) -> EagleConfig:
    """Detect the layout and version, and check the head fits the target."""
    spec_type = raw.get("speculators_model_type")
    if spec_type is not None:
        if spec_type not in ("eagle", "eagle3"):
            raise ModelLoadError(f"speculators model type {spec_type!r} is not an EAGLE head (eagle, eagle3)")
        layout, version = "speculators", 3 if spec_type == "eagle3" else 1
        layer_raw = dict(raw.get("transformer_layer_config") or {})
        if not layer_raw:
            raise ModelLoadError("speculators config.json has no transformer_layer_config")
        fc_bias = bool(raw.get("fusion_bias", False))
    else:
        archs = " ".join(raw.get("architectures") or [])
        layout = "safeailab"
        version = 3 if "eagle3" in archs.lower() or "draft_vocab_size" in raw else 1
        layer_raw, fc_bias = raw, version == 1  # SafeAILab's EAGLE-1/2 fc has a bias, EAGLE-3's none
        if "fc_bias" in raw:
            fc_bias = bool(raw["fc_bias"])
    layer = _layer_config(layer_raw, target)
    aux = raw.get("eagle_aux_hidden_state_layer_ids") or (raw.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    aux_layers = tuple(int(i) for i in aux) if aux else default_aux_layers(target.num_layers)
    if version == 3 and any(not 0 <= i < target.num_layers for i in aux_layers):
        raise ModelLoadError(f"EAGLE-3 taps layers {aux_layers}; the target has {target.num_layers}")
    target_hidden = int(raw.get("target_hidden_size") or layer_raw.get("target_hidden_size") or layer.hidden_size)
    if target_hidden != target.hidden_size:
        raise ModelLoadError(f"EAGLE head reads hidden states of width {target_hidden}; the target's are "
                             f"{target.hidden_size}")
    draft_vocab = int(raw.get("draft_vocab_size") or layer_raw.get("draft_vocab_size") or layer.vocab_size)
    return EagleConfig(version=version, layout=layout, layer=layer, draft_vocab_size=draft_vocab,
                       fc_bias=fc_bias, aux_layers=aux_layers if version == 3 else (),
                       norm_before_residual=bool(raw.get("norm_before_residual", layout == "speculators")),
                       target_hidden_size=target_hidden)


def load_eagle_config(folder: str | Path, target: ModelConfig) -> EagleConfig:
    return eagle_config_from_dict(read_config_json(folder, "an EAGLE head folder"), target)
