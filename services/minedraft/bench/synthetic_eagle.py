"""A synthetic EAGLE-3 head for a synthetic target (bench/synthetic_pair.py), with a set greedy acceptance.

The head has the published shape (one decoder layer of the target's width whose attention reads
concat(embedding, features), fc over the target's three tapped residual streams, its own norm and
lm_head over a reduced draft vocabulary with a d2t map) and runs through the engine's own
EagleHead/EagleRunner/EagleDrafter. Its weights are built so that it predicts the peaked pair's
successor pi(x) of its input token x on a share `agree` of tokens, as the synthetic draft model does:
- At draft position p the head reads token x = p+1 only through attention. Each kv head's keys and
  values are a slice of the normed embedding, and every query head reads the slice of its kv head, so a
  position attends almost only to itself (the self score is |slice|^2 / sqrt(d), tens of units above
  any other) and o_proj writes the values back: the output hidden state carries e_x on the first
  num_kv_heads x head_dim coordinates.
- lm_head is `peaked_head(draft=True, agree)` (the target's seed, so the same pi where they agree) built
  on the embedding cut to those coordinates; fc, the MLP and hidden_norm are random and small beside
  that peak, so features move the logits little (the head reads them, as a trained one does, at full cost).
- The reduced vocabulary is a union of whole cycles of the target's pi (filled up with other ids): the
  target's greedy path from a token of those cycles stays in them, so prompts drawn from
  `closed_tokens` keep every target token draftable. Prompts elsewhere lower acceptance.
  `draft_vocab=0` keeps the full vocabulary (d2t all zeros).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from minedraft.bench.peaked_head import peaked_head, successors
from minedraft.bench.synthetic_pair import SyntheticSpec, _seeded_normal, synthetic_shared
from minedraft.engine.config import ModelConfig
from minedraft.engine.eagle_config import EagleConfig, default_aux_layers
from minedraft.engine.eagle_drafter import EagleDrafter
from minedraft.engine.eagle_head import EagleHead
from minedraft.engine.eagle_runner import EagleRunner
from minedraft.engine.hidden_capture import CapturingRunner
from minedraft.engine.model import CausalLM

HEAD_VOCAB = {"llama3-8b": 32000}  # the published Llama-3.1-8B EAGLE-3 heads' draft vocabulary
SELF_SCORE = 2.0  # query and key scale on the embedding slice: self score SELF_SCORE^2 * sqrt(head_dim)
HIDDEN_NORM = 0.1  # the features' share of the residual stream (and of the fed-back output)
MLP_SCALE = 0.25  # the random MLP's output against the carried embedding


@dataclass(frozen=True, slots=True)
class HeadVocabulary:
    """The draft vocabulary (sorted target ids) and its part closed under the target's pi."""

    ids: torch.Tensor  # [draft_vocab]
    closed: torch.Tensor  # target ids whose greedy successors stay inside `ids`


def head_config(target: ModelConfig, draft_vocab: int = 0) -> EagleConfig:
    """An EAGLE-3 head (speculators' defaults) for `target`: one layer of its shape, the usual taps."""
    return EagleConfig(version=3, layout="speculators", layer=replace(target, num_layers=1),
                       draft_vocab_size=draft_vocab or target.vocab_size, fc_bias=False,
                       aux_layers=default_aux_layers(target.num_layers), norm_before_residual=True,
                       target_hidden_size=target.hidden_size)


def cycle_labels(pi: torch.Tensor) -> torch.Tensor:
    """Each id's cycle under the permutation pi, named by its smallest member (pointer doubling)."""
    label, step = torch.arange(pi.shape[0], device=pi.device), pi.clone()
    for _ in range(math.ceil(math.log2(max(pi.shape[0], 2))) + 1):
        label = torch.minimum(label, label[step])
        step = step[step]
    return label


def head_vocabulary(vocab: int, draft_vocab: int, seed: int) -> HeadVocabulary:
    """Whole cycles of the target's pi, smallest first, while they fit; then the lowest other ids."""
    pi = successors(vocab, False, 1.0, seed, torch.device("cpu"))
    if not draft_vocab or draft_vocab >= vocab:
        every = torch.arange(vocab)
        return HeadVocabulary(every, every)
    label = cycle_labels(pi)
    sizes = torch.bincount(label, minlength=vocab)
    cycles = torch.nonzero(sizes).squeeze(1)
    cycles = cycles[torch.argsort(sizes[cycles], stable=True)]
    fits = torch.cumsum(sizes[cycles], 0) <= draft_vocab
    inside = torch.isin(label, cycles[fits])
    closed = torch.nonzero(inside).squeeze(1)
    fill = torch.nonzero(~inside).squeeze(1)[: draft_vocab - closed.shape[0]]
    return HeadVocabulary(torch.sort(torch.cat((closed, fill))).values, closed)


def head_prompts(closed: torch.Tensor, count: int, length: int = 32, seed: int = 0) -> list[list[int]]:
    """Random prompts over the closed tokens, so the target's greedy path stays draftable."""
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, closed.shape[0], (count, length), generator=gen)
    return closed[picks].tolist()


def _attention_copy(head: EagleHead) -> None:
    """q, k, v read the normed embedding's slice of their kv head; o_proj averages each group's heads
    back onto that slice. The feature half of attention's input gets no weight."""
    cfg = head.config
    attn = head.layers[0].self_attn
    d, kv, group = cfg.head_dim, cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
        proj.weight.zero_()
    eye = torch.eye(d, device=attn.q_proj.weight.device, dtype=attn.q_proj.weight.dtype)
    for g in range(kv):
        cols = slice(g * d, (g + 1) * d)
        attn.k_proj.weight[cols, cols] = SELF_SCORE * eye
        attn.v_proj.weight[cols, cols] = eye
        for j in range(group):
            rows = slice((g * group + j) * d, (g * group + j + 1) * d)
            attn.q_proj.weight[rows, cols] = SELF_SCORE * eye
            attn.o_proj.weight[cols, rows] = eye / group


def build_synthetic_head(target: CausalLM, agree: float, draft_vocab: int = 0, seed: int = 0) -> EagleHead:
    """The head beside an in-memory synthetic target (its device and dtype; the embedding is copied, as
    the loader copies a target's). `seed` must be the target's, so both heads share pi where they agree."""
    return head_for(target.config, target.model.embed_tokens.weight, agree, draft_vocab, seed)


def write_synthetic_head(target: SyntheticSpec, agree: float, draft_vocab: int, folder: str | Path,
                         device: str | torch.device, dtype: torch.dtype) -> Path:
    """The head of a synthetic target, built from the target's embedding alone (on the device type and in the
    dtype the target's services build it, so it is the same embedding) and written as a folder for the
    services (`write_head`)."""
    embedding, _, cfg = synthetic_shared(str(target), device, dtype)
    return write_head(head_for(cfg, embedding, agree, draft_vocab), folder)


def head_for(cfg: ModelConfig, embedding: torch.Tensor, agree: float, draft_vocab: int = 0, seed: int = 0
             ) -> EagleHead:
    """The head of the synthetic target with this config and embedding, on the embedding's device and dtype."""
    device, dtype = embedding.device, embedding.dtype
    eagle = head_config(cfg, draft_vocab)
    head = EagleHead.empty(eagle, device, dtype)
    vocabulary = head_vocabulary(cfg.vocab_size, eagle.draft_vocab_size, seed).ids.to(device)
    carried = cfg.num_kv_heads * cfg.head_dim
    with torch.no_grad():
        for name, param in head.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(HIDDEN_NORM if name.endswith("hidden_norm.weight") else 1.0)
            else:
                std = param.shape[-1] ** -0.5 * (MLP_SCALE if name.endswith("down_proj.weight") else 1.0)
                param.copy_(_seeded_normal(tuple(param.shape), f"eagle.{name}", seed, std, device, dtype))
        head.embed_tokens.weight.copy_(embedding)
        _attention_copy(head)
        cut = embedding.float().clone()
        cut[:, carried:] = 0  # what the head's output carries of e_x
        random_head = _seeded_normal((cfg.vocab_size, cfg.hidden_size), "eagle.lm_head.weight", seed,
                                     cfg.hidden_size ** -0.5, device, torch.float32)
        full = peaked_head(random_head, cut * (cfg.hidden_size / carried), True, agree, seed)
        head.lm_head.weight.copy_(full[vocabulary])
        head.d2t = vocabulary - torch.arange(vocabulary.shape[0], device=device)
    return head.fuse_projections().eval()


def head_runners(target: CausalLM, head: EagleHead, num_blocks: int, block_size: int = 16
                 ) -> tuple[CapturingRunner, EagleDrafter]:
    """The target's capturing runner (the head's taps) and the head's drafter, on the target's device."""
    device = target.model.embed_tokens.weight.device
    capture = CapturingRunner(target, num_blocks, block_size, device, head.eagle.aux_layers)
    return capture, EagleDrafter(EagleRunner(head, num_blocks, block_size, device))


def write_head(head: EagleHead, folder: str | Path) -> Path:
    """The head as a `speculators` EAGLE-3 folder (config.json, model.safetensors; the embedding left to
    the target, as published heads do), which `eagle_pair.head_beside` loads next to the same target."""
    eagle, cfg = head.eagle, head.config
    layer = {"model_type": "llama", "hidden_act": "silu", "hidden_size": cfg.hidden_size,
             "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_heads,
             "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps,
             "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_position_embeddings,
             "rope_theta": cfg.rope.theta, "num_hidden_layers": 1}
    config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
              "transformer_layer_config": layer, "draft_vocab_size": eagle.draft_vocab_size,
              "norm_before_residual": eagle.norm_before_residual, "target_hidden_size": eagle.target_hidden_size,
              "eagle_aux_hidden_state_layer_ids": list(eagle.aux_layers)}
    # Checkpoint names only: where the GEMM takes a weight as it is, fuse_projections registers the same tensor
    # again under a fused name (`fc_weight`, `o_weight`, ...), which would otherwise hide the checkpoint's name.
    tensors = {name: p.detach().cpu().contiguous() for name, p in head.named_parameters(remove_duplicate=False)
               if name != "embed_tokens.weight" and not name.rsplit(".", 1)[-1].endswith("_weight")}
    tensors["d2t"] = head.d2t.cpu().contiguous()
    ids = torch.arange(eagle.draft_vocab_size) + tensors["d2t"]
    tensors["t2d"] = torch.zeros(cfg.vocab_size, dtype=torch.bool).index_fill(0, ids, True)
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    save_file(tensors, str(path / "model.safetensors"))
    return path
