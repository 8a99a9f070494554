"""An EAGLE draft head: one decoder layer that drafts from the target's hidden states.

Draft position p reads the embedding of token p+1 and a hidden state for position p: the target's
(from the verifier) for committed positions, the head's own output for the drafts it feeds back. So
the head's KV at p depends on the token after p, and its output at p predicts token p+2.
- EAGLE-1/2: fc(concat(embed, h)) (2h -> h), then the layer without its input norm; the output goes
  through the target's lm_head as it is.
- EAGLE-3: the target ships the residual-stream inputs of three layers (3h); fc (3h -> h) folds them on
  the draft side, while the head's own outputs (h) are fed back as they are. The layer's attention reads
  concat(input_layernorm(embed), hidden_norm(h)) (2h -> q, k, v); the output is normed and read by the
  head's own lm_head over a reduced vocabulary, mapped to target ids by `d2t`.
The embedding (and EAGLE-1's lm_head) are copies of the target's (engine/eagle_loader.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from minedraft.engine.attention import AttentionMetadata, take_rows
from minedraft.engine.config import ModelConfig
from minedraft.engine.eagle_config import EagleConfig
from minedraft.engine.fused import add_rms_norm, rms_norm
from minedraft.engine.layers import RMSNorm, RotaryEmbedding, gemm_weight, linear
from minedraft.engine.model import DecoderLayer


class EagleHead(nn.Module):
    """Parameter names are the checkpoints' after the loader's renaming (`layers.0.`, `fc`, `norm`)."""

    def __init__(self, eagle: EagleConfig) -> None:
        super().__init__()
        cfg = eagle.layer
        self.eagle = eagle
        self.config: ModelConfig = cfg  # what the runner and its KV cache read (one layer)
        self.source_dir: Path | None = None  # the target's folder: its tokenizer.json serves grammars
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.fc = nn.Linear(eagle.feature_width + (h if eagle.version == 1 else 0), h, bias=eagle.fc_bias)
        layer = DecoderLayer(cfg)
        if eagle.version == 3:
            attn = layer.self_attn
            attn.q_proj = nn.Linear(2 * h, attn.q_proj.out_features, bias=cfg.qkv_bias)
            attn.k_proj = nn.Linear(2 * h, attn.k_proj.out_features, bias=cfg.qkv_bias)
            attn.v_proj = nn.Linear(2 * h, attn.v_proj.out_features, bias=cfg.qkv_bias)
            layer.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
            self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([layer])
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope)
        self.lm_head = nn.Linear(h, eagle.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(eagle.draft_vocab_size, dtype=torch.long), persistent=False)
        self.fc_weight: torch.Tensor | None = None  # set by fuse_projections
        self.head_weight: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], pick: torch.Tensor | None = None
                ) -> torch.Tensor:
        """input_ids [B, Q] (token p+1 at draft position p), features [B, Q, F]: the target's (F = the
        feature width) or the head's own outputs (F = h). Returns the output hidden states [B, Q, h], or
        with `pick` [B, n] those rows only: fed back as the next position's features, and read by `logits`."""
        eagle, layer = self.eagle, self.layers[0]
        embeds = self.embed_tokens(input_ids)
        cos_sin = self.rotary.cos_sin(meta.positions)
        if eagle.version == 1:
            x = linear(torch.cat((embeds, features.to(embeds.dtype)), -1), self.fc_weight, self.fc.bias)
            residual, attn_in = x, x  # the layer has no input norm
        else:
            x = features.to(embeds.dtype)
            if x.shape[-1] != self.config.hidden_size:  # the target's concatenated taps
                x = linear(x, self.fc_weight, self.fc.bias)
            normed = rms_norm(x, layer.hidden_norm.weight, layer.hidden_norm.eps)
            residual = normed if eagle.norm_before_residual else x
            embeds = rms_norm(embeds, layer.input_layernorm.weight, layer.input_layernorm.eps)
            attn_in = torch.cat((embeds, normed), -1)
        narrow = pick if pick is not None and meta.backend == "torch" and pick.shape[1] < input_ids.shape[1] else None
        attn = layer.self_attn(attn_in, cos_sin, kv_caches[0], meta, narrow)
        if narrow is not None:
            residual = take_rows(residual, narrow)
        elif pick is not None:  # every row computed: keep the picked ones
            attn, residual = take_rows(attn, pick), take_rows(residual, pick)
        post = layer.post_attention_layernorm
        h, residual = add_rms_norm(attn, residual, post.weight, post.eps, meta.backend)
        return layer.mlp(h, meta.backend) + residual

    def logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """[..., V] float32 over the target's vocabulary (EAGLE-3: -inf outside the draft vocabulary); into
        `out` when given (a graph's shared logits buffer)."""
        assert self.head_weight is not None, "fuse_projections() first"
        if self.eagle.version == 1:
            logits = linear(hidden, self.head_weight)
            return out.copy_(logits) if out is not None else logits.float()
        small = linear(rms_norm(hidden, self.norm.weight, self.norm.eps), self.head_weight).float()
        shape = (*small.shape[:-1], self.config.vocab_size)
        full = out.fill_(float("-inf")) if out is not None else small.new_full(shape, float("-inf"))
        ids = torch.arange(small.shape[-1], device=small.device) + self.d2t
        full[..., ids] = small
        return full

    @classmethod
    def empty(cls, eagle: EagleConfig, device: str | torch.device, dtype: torch.dtype) -> EagleHead:
        """Uninitialised weights on `device`, for the loader to fill."""
        with torch.device("meta"):
            head = cls(eagle)
        head = head.to_empty(device=device).to(dtype)
        head.d2t = torch.zeros(eagle.draft_vocab_size, dtype=torch.long, device=device)
        head.rotary.inv_freq = RotaryEmbedding(eagle.layer.head_dim, eagle.layer.rope).inv_freq.to(device)
        return head

    def fuse_projections(self) -> EagleHead:
        layer = self.layers[0]
        layer.self_attn.fuse()
        layer.mlp.fuse()
        self.fc_weight = gemm_weight(self.fc.weight)
        self.head_weight = gemm_weight(self.lm_head.weight)
        return self
