"""Model configuration read from a Hugging Face `config.json`.

One typed dataclass covers the Llama family we run (Llama 2/3, Mistral, Qwen2/2.5,
Qwen3); the differences between them are a handful of flags, not separate classes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minedraft.core.errors import ModelLoadError
from minedraft.engine.fp8_config import Fp8Config, fp8_config_from_dict

SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding parameters, including Llama 3's frequency rescaling."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """What the engine needs to build and run one decoder-only model."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    rope: RopeConfig = field(default_factory=RopeConfig)
    sliding_window: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    quantization: Fp8Config | None = None  # FP8 linear projections (engine/fp8_config.py); None: model dtype


def _rope_from_hf(raw: dict[str, Any]) -> RopeConfig:
    """Read rope settings from either the v4 (`rope_scaling`) or v5 (`rope_parameters`) layout."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    if rope_type not in ("default", "llama3"):
        raise ModelLoadError(
            f"rope type {rope_type!r} is not supported (supported: default, llama3)"
        )
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", 8192)
        ),
    )


def _eos_ids(raw: dict[str, Any]) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    if eos is None:
        return ()
    if isinstance(eos, int):
        return (eos,)
    return tuple(int(e) for e in eos)


def _sliding_window(raw: dict[str, Any], family: str) -> int | None:
    window = raw.get("sliding_window")
    if window is None:
        return None
    if family in ("qwen2", "qwen3") and not raw.get("use_sliding_window", False):
        return None
    return int(window)


def model_config_from_dict(raw: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from the parsed JSON of a Hugging Face config."""
    archs = raw.get("architectures") or []
    family = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if family is None:
        family = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}.get(
            str(raw.get("model_type", ""))
        )
    if family is None:
        raise ModelLoadError(
            f"architecture {archs or raw.get('model_type')!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ModelLoadError(f"hidden_act {act!r} is not supported (only silu/SwiGLU)")
    try:
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        cfg = ModelConfig(
            family=family,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or bool(raw.get("attention_bias", False)),
            qk_norm=family == "qwen3",
            rope=_rope_from_hf(raw),
            sliding_window=_sliding_window(raw, family),
            eos_token_ids=_eos_ids(raw),
            quantization=fp8_config_from_dict(raw.get("quantization_config")),
        )
    except KeyError as exc:
        raise ModelLoadError(f"config.json is missing required field {exc.args[0]!r}") from exc
    if cfg.num_heads % cfg.num_kv_heads:
        raise ModelLoadError(
            f"num_attention_heads ({cfg.num_heads}) must be a multiple of "
            f"num_key_value_heads ({cfg.num_kv_heads})"
        )
    return cfg


def read_config_json(folder: str | Path, kind: str = "a Hugging Face model folder") -> dict:
    """A folder's `config.json` as a dict, or a ModelLoadError saying what is wrong with it."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder}: no config.json found (is this {kind}?)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})") from exc


def load_model_config(folder: str | Path) -> ModelConfig:
    """Read and validate `config.json` from a model folder."""
    return model_config_from_dict(read_config_json(folder))
