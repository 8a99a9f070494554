"""Decoder-only Llama-family model over a paged KV cache.

Parameter names follow the Hugging Face checkpoints (`model.layers.N.self_attn.q_proj`
and so on) so safetensors load by name with no renaming table.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from minedraft.engine.attention import AttentionMetadata, paged_attention, select_queries, take_rows
from minedraft.engine.blas_plan import PLAN, TRITON, qkv_rope_triton
from minedraft.engine.config import ModelConfig
from minedraft.engine.fp8_linear import fp8_qkv_rope
from minedraft.engine.fp8_weights import linear_weight
from minedraft.engine.fused import add_rms_norm, rope_and_store
from minedraft.engine.layers import (
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    Weight,
    fuse_linears,
    gemm_weight,
    linear,
    rope_inverse_frequencies,
)


def unpack_rows(packed: torch.Tensor, rows: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Packed tokens [1, N, D] back into the [B, Q, D] layout (padding rows zero) at flat indices `rows`."""
    full = packed.new_zeros(shape[0] * shape[1], packed.shape[-1])
    return full.index_copy_(0, rows, packed[0]).view(*shape, packed.shape[-1])


class Attention(nn.Module):
    """Grouped-query self-attention with optional q/k bias (Qwen2) and q/k norm (Qwen3)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.qkv_weight: Weight | None = None  # set by fuse(), before the first forward (`gemm_weight`)
        self.qkv_bias: torch.Tensor | None = None
        self.o_weight: Weight | None = None

    def fuse(self) -> None:
        qkv_weight, self.qkv_bias = fuse_linears([self.q_proj, self.k_proj, self.v_proj])
        self.qkv_weight = gemm_weight(qkv_weight)
        self.o_weight = gemm_weight(linear_weight(self.o_proj))

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        pick: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Every token's keys and values are stored; with `pick` ([B, n] query indices) only those
        queries attend and come out ([B, n, hidden]). With `rows` (engine/ragged.py) x is packed
        [1, N, hidden], the valid tokens of the [B, Q] layout at those flat indices: the projections
        run on them alone and only the attention sees the padded layout (on the torch path; the triton path's
        metadata has the attention read the packed tokens themselves, `packed_metadata`). Inside a CUDA graph's
        capture the BLAS plan may run the projection, the rotation and the KV write as one kernel
        (`engine/cuda/skinny_rope.py`: the same bits as the two it replaces); an FP8 projection at a few tokens
        runs them as one kernel too (`engine/cuda/fp8_paired.py`)."""
        scatter = rows is not None and meta.q_offsets is None
        qk_norm = (self.q_norm, self.k_norm) if self.q_norm is not None and self.k_norm is not None else None
        choice = None
        if meta.backend == "triton" and qk_norm is None and not scatter and PLAN.active:
            choice = PLAN.apply_rope(x, self.qkv_weight, self.num_heads, self.num_kv_heads, self.head_dim)
        q = None
        if choice is not None and choice.startswith(TRITON):  # one kernel: projection, rotation, KV write
            q = qkv_rope_triton(choice, x, self.qkv_weight, self.qkv_bias, cos_sin, meta.slot_mapping, kv,
                                self.num_heads, self.num_kv_heads, self.head_dim)
        elif choice is None and meta.backend == "triton" and qk_norm is None and not scatter:  # FP8: the same
            q = fp8_qkv_rope(x, self.qkv_weight, self.qkv_bias, cos_sin, meta.slot_mapping, kv, self.num_heads,
                             self.num_kv_heads, self.head_dim)
        if q is None:
            if choice is None:
                qkv = linear(x, self.qkv_weight, self.qkv_bias)
            else:  # the plan set this library for the GEMM
                qkv = F.linear(x, self.qkv_weight, self.qkv_bias)  # type: ignore[arg-type]
            if scatter:
                qkv = unpack_rows(qkv, rows, meta.positions.shape)
            q = rope_and_store(qkv, cos_sin, kv, meta, self.num_heads, self.num_kv_heads, self.head_dim, qk_norm)
        if pick is not None:
            q, meta = take_rows(q, pick), select_queries(meta, pick)
        out = paged_attention(q, kv[0], kv[1], meta, self.scale)
        out = out.reshape(*out.shape[:2], -1)
        if scatter:
            out = out.view(-1, out.shape[-1]).index_select(0, rows).unsqueeze(0)
        return linear(out, self.o_weight)


Reduce = Callable[[torch.Tensor], torch.Tensor]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class DecoderLayer(nn.Module):
    """Pre-norm block; `reduce` sums the row-parallel partial outputs under tensor parallelism.

    The residual stream travels beside the layer's output so each norm can fold in the
    preceding residual add (one kernel on CUDA).
    """

    def __init__(self, cfg: ModelConfig, reduce: Reduce = _identity) -> None:
        super().__init__()
        self.reduce = reduce
        self.self_attn = Attention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        pick: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's (reduced) output, not yet added to `residual`. With `pick`, only those
        rows go on past the attention (see `CausalLM.forward`); with `rows`, x is packed (`Attention`)."""
        norm_in, norm_post = self.input_layernorm, self.post_attention_layernorm
        h, residual = add_rms_norm(x, residual, norm_in.weight, norm_in.eps, meta.backend)
        attn = self.reduce(self.self_attn(h, cos_sin, kv, meta, pick, rows))
        if pick is not None:
            residual = take_rows(residual, pick)
        h, residual = add_rms_norm(attn, residual, norm_post.weight, norm_post.eps, meta.backend)
        return self.reduce(self.mlp(h, meta.backend)), residual


class DecoderBody(nn.Module):
    """Embedding, decoder layers and final norm (the `model.` prefix of HF checkpoints)."""

    def __init__(self, cfg: ModelConfig, reduce: Reduce = _identity) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, reduce) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope)


class CausalLM(nn.Module):
    """The full model: hidden states from `forward`, logits from `logits`.

    `fuse_projections` must run once the weights are on their device (load_model and
    minedraft.bench.synthetic_pair do it) before the first forward."""

    def __init__(self, cfg: ModelConfig, reduce: Reduce = _identity) -> None:
        super().__init__()
        self.config = cfg
        self.source_dir: Path | None = None  # the folder it was loaded from (its tokenizer.json serves grammars)
        self.model = DecoderBody(cfg, reduce)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.head_weight: torch.Tensor | None = None  # set by fuse_projections (`gemm_weight`)

    def forward(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        pick: torch.Tensor | None = None,
        aux_layers: tuple[int, ...] = (),
        aux: list[torch.Tensor] | None = None,
        packed: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Run [B, Q] tokens through the decoder, writing their KV; returns [B, Q, hidden], or with `pick`
        ([B, n] query indices) the hidden states of those rows only, [B, n, hidden].

        Only the last layer's keys and values of the other rows are ever read, and they come from its
        input: on the torch path (CPU) the last layer runs its attention output, MLP and the final norm on
        the picked rows alone. A prompt's prefill then pays one layer's K/V projections for all but its
        last rows instead of the whole layer, which for a one-layer draft is most of its prefill.

        `packed` (rows, picked), from engine/ragged.py: the layers run on the valid tokens alone (flat
        indices `rows` of the [B, Q] layout) and the result is the hidden states at `picked` [B, n]
        (indices into the packed tokens); `pick` is then unused."""
        rows = None
        if packed is not None:
            rows, pick = packed[0], None
            input_ids = input_ids.reshape(-1).index_select(0, rows).unsqueeze(0)
        x = self.model.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        cos_sin = self.model.rotary.cos_sin(meta.positions)  # per packed token on the triton path, else [B, Q]
        narrow = pick if pick is not None and meta.backend == "torch" and pick.shape[1] < input_ids.shape[1] else None
        last = len(self.model.layers) - 1
        for i, (layer, kv) in enumerate(zip(self.model.layers, kv_caches, strict=True)):
            if aux is not None and i in aux_layers:  # the residual stream entering layer i (EAGLE-3's taps)
                aux.append(x if residual is None else x + residual)
            x, residual = layer(x, residual, cos_sin, kv, meta, narrow if i == last else None, rows)
        assert residual is not None
        if packed is not None:
            x, residual = x[0, packed[1]], residual[0, packed[1]]
        if pick is not None and narrow is None and max(input_ids.shape[1], pick.shape[1]) > 1:  # else the identity
            x, residual = take_rows(x, pick), take_rows(residual, pick)
        norm = self.model.norm
        return add_rms_norm(x, residual, norm.weight, norm.eps, meta.backend)[0]

    @classmethod
    def empty(cls, cfg: ModelConfig, reduce: Reduce, device: str | torch.device, dtype: torch.dtype) -> CausalLM:
        """Uninitialised weights on `device` (no CPU copy first), for a loader to fill."""
        with torch.device("meta"):
            model = cls(cfg, reduce)
        model = model.to_empty(device=device).to(dtype)
        # Rotary frequencies stay float32 whatever the weight dtype, as in the reference.
        model.model.rotary.inv_freq = rope_inverse_frequencies(cfg.head_dim, cfg.rope).to(device)
        if cfg.tie_word_embeddings:  # to_empty allocated the head separately
            model.lm_head.weight = model.model.embed_tokens.weight
        return model

    def fuse_projections(self) -> CausalLM:
        """Concatenate q/k/v and gate/up weights (see `layers.fuse_linears`) and prepare every
        projection for the device's GEMM (`layers.gemm_weight`); call once on the final device."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        self.head_weight = gemm_weight(self.lm_head.weight)
        return self

    def logits(self, hidden: torch.Tensor, widen: bool = True) -> torch.Tensor:
        """The head's logits, in float32 (`widen`) or in the weights' dtype (a CUDA graph's buffer, widened as it
        is copied out: engine/cuda_graphs.py)."""
        assert self.head_weight is not None, "fuse_projections() first"
        out = linear(hidden, self.head_weight)
        return out.float() if widen else out
