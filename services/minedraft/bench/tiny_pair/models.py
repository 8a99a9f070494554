"""The pair's architecture (Llama, target 4 layers, draft 1) and its saving and loading."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from minedraft.bench.tiny_pair.bpe_tokenizer import EOS_ID, MAX_POSITIONS, VOCAB_SIZE, save_tokenizer, write_json


def build_llama_config(num_layers: int) -> LlamaConfig:
    """The shared architecture of target and draft; only the depth differs."""
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=688,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=EOS_ID,
        eos_token_id=EOS_ID,
        attention_dropout=0.0,
        attn_implementation="sdpa",
    )


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameter count (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def init_draft_from_target(draft: LlamaForCausalLM, target: LlamaForCausalLM) -> None:
    """Start the draft from the target's (tied) token embedding and final norm."""
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        draft.model.norm.weight.copy_(target.model.norm.weight)


def save_model(model: LlamaForCausalLM, tokenizer: Tokenizer, out_dir: Path) -> None:
    """Save bfloat16 safetensors weights, config, generation config and tokenizer."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.safetensors"):
        stale.unlink()
    bf16_model = model.to(torch.bfloat16)
    bf16_model.config.dtype = torch.bfloat16
    bf16_model.save_pretrained(out_dir)
    add_legacy_config_keys(out_dir / "config.json")
    save_tokenizer(tokenizer, out_dir)
    model.to(torch.float32)


def add_legacy_config_keys(config_path: Path) -> None:
    """Also write ``torch_dtype`` / ``rope_theta`` for loaders predating transformers v5."""
    config = json.loads(config_path.read_text())
    config["torch_dtype"] = "bfloat16"
    config["rope_theta"] = config.get("rope_parameters", {}).get("rope_theta", 10000.0)
    write_json(config_path, config)


def load_saved_model(model_dir: Path) -> LlamaForCausalLM:
    """Load a saved model back in float32 for evaluation."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model
