"""transformers `generate` and assisted generation at batch 1 on our weights: the peer baseline."""

from __future__ import annotations

import time

import torch

from minedraft.engine.model import CausalLM


def hf_model(ours: CausalLM, device: str = "cuda:0"):
    """A transformers Llama with exactly our model's weights (every tensor, or no comparison)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = ours.config
    cfg = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                      num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                      max_position_embeddings=c.max_position_embeddings, rope_theta=c.rope.theta,
                      tie_word_embeddings=False)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(torch.float32)
    model.load_state_dict(ours.state_dict(), strict=True)
    return model.eval()


def hf_peer(target_model: CausalLM, draft_model: CausalLM, prompt: list[int], max_tokens: int) -> dict:
    """Tokens/s and greedy tokens of transformers AR and assisted generation on one prompt."""
    target, draft = hf_model(target_model), hf_model(draft_model)
    ids = torch.tensor([prompt], device="cuda:0")
    out: dict = {}
    for name, extra in (("hf_ar", {}), ("hf_assisted", {"assistant_model": draft})):
        target.generate(ids, max_new_tokens=8, do_sample=False, **extra)
        torch.cuda.synchronize()
        start = time.perf_counter()
        gen = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                              min_new_tokens=max_tokens, do_sample=False, pad_token_id=0, **extra)
        torch.cuda.synchronize()
        out[f"{name}_tokens_per_s"] = (gen.shape[1] - ids.shape[1]) / (time.perf_counter() - start)
        out[f"{name}_tokens"] = gen[0, ids.shape[1]:].tolist()
    del target, draft
    torch.cuda.empty_cache()
    return out
