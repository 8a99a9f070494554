"""`python -m minedraft.bench.tiny_pair.eagle`: train the bundled tiny EAGLE head for the tiny target.

Why: an EAGLE head drafts from the target's own last hidden state, so it needs a trained head for the
bundled target before `minedraft serve --draft-kind eagle` can run out of the box. The head is trained
on the same stdlib corpus as the pair, on the CPU, in minutes, and saved in SafeAILab's EAGLE-1 layout
(a one-layer Llama `config.json`, `fc` over concat(embedding, hidden), a decoder layer without its input
norm; embedding and lm_head are the target's), which the engine's loader reads like a published head.

The module here is the training form of what `engine/eagle_head.py` runs: draft position p reads the
embedding of token p+1 and the target's hidden state at p, and predicts the hidden state (and through
the target's head, the token) at p+1. Loss: EAGLE's feature regression plus the KL to the target's
next-token distribution, with uniform noise on the input features. Trained with the target's states
alone, the head drafts its first token better than the tiny draft model but its later ones worse (they
read its own outputs), so a second phase unrolls three draft steps as they run (`--unroll`: each step
attends to the true pairs and to its own earlier steps only, the training-time test of EAGLE-3). The
bundled head is the two phases in a row:

    python -m minedraft.bench.tiny_pair.eagle --threads 1 --out-dir /tmp/tiny-eagle-800
    python -m minedraft.bench.tiny_pair.eagle --init /tmp/tiny-eagle-800/model.safetensors --unroll 3 \
        --steps 250 --seq-len 96 --lr 5e-4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaForCausalLM

from minedraft.bench.tiny_pair.bpe_tokenizer import concatenate_with_eos, encode_documents, write_json
from minedraft.bench.tiny_pair.corpus import load_corpus
from minedraft.bench.tiny_pair.models import load_saved_model
from minedraft.bench.tiny_pair.training import TrainSettings, run_training
from minedraft.bundled import TINY_EAGLE, TINY_TARGET


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Half-split rotary embedding of [B, heads, T, d] at positions [T]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * inv[None, :]
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    half = torch.cat((-x[..., d // 2:], x[..., : d // 2]), -1)
    return x * cos + half * sin


class TrainingHead(nn.Module):
    """EAGLE-1 head over a frozen target; parameter names are the checkpoint's."""

    def __init__(self, target: LlamaForCausalLM) -> None:
        super().__init__()
        cfg = target.config
        h, self.heads, self.kv_heads, self.head_dim = cfg.hidden_size, cfg.num_attention_heads, \
            cfg.num_key_value_heads, cfg.head_dim
        self.theta, self.eps = 10000.0, cfg.rms_norm_eps
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.post_norm = nn.Parameter(torch.ones(h))
        self.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Pairs [B, T, h] each (embedding of token p+1, feature at p) -> predicted features at p+1."""
        b, t, _ = embeds.shape
        z = self.fc(torch.cat((embeds, features), -1))
        pos = torch.arange(t)
        q = rotate(self.q_proj(z).view(b, t, self.heads, -1).transpose(1, 2), pos, self.theta)
        k = rotate(self.k_proj(z).view(b, t, self.kv_heads, -1).transpose(1, 2), pos, self.theta)
        v = self.v_proj(z).view(b, t, self.kv_heads, -1).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        r = z + self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        n = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + self.eps) * self.post_norm
        return r + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))

    def unrolled(self, embeds: list[torch.Tensor], features: torch.Tensor) -> list[torch.Tensor]:
        """Training-time test: step s at index i reads (token i+s, the step s-1 output at i) at position i+s-1
        and attends, as a draft step does, to the true pairs up to i and to steps 2..s at i only. embeds[s-1]
        [B, N, h] are the tokens of step s; features [B, N, h] the target's at 0..N-1. Returns each step's
        outputs, step s at i predicting the feature at i+s."""
        b, n, _ = features.shape
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        h = features
        for s, emb in enumerate(embeds):
            z = self.fc(torch.cat((emb, h), -1))
            pos = torch.arange(n) + s
            q = rotate(self.q_proj(z).view(b, n, self.heads, -1).transpose(1, 2), pos, self.theta)
            k = rotate(self.k_proj(z).view(b, n, self.kv_heads, -1).transpose(1, 2), pos, self.theta)
            v = self.v_proj(z).view(b, n, self.kv_heads, -1).transpose(1, 2)
            group = self.heads // self.kv_heads
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            keys.append(k)
            values.append(v)
            scale = self.head_dim ** -0.5
            first = (q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))
            own = [(q * kt).sum(-1, keepdim=True) * scale for kt in keys[1:]]  # steps 2..s at i itself
            weights = torch.softmax(torch.cat((first, *own), -1), -1)
            attn = weights[..., :n] @ values[0]
            for t, vt in enumerate(values[1:]):
                attn = attn + weights[..., n + t:n + t + 1] * vt
            r = z + self.o_proj(attn.transpose(1, 2).reshape(b, n, -1))
            norm = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + self.eps) * self.post_norm
            h = r + self.down_proj(F.silu(self.gate_proj(norm)) * self.up_proj(norm))
            outs.append(h)
        return outs

    def load_layout(self, path: Path) -> None:
        """Start from a saved head (`state_in_layout`'s names)."""
        from safetensors.torch import load_file

        state = load_file(str(path))
        with torch.no_grad():
            for name, param in self._layout_params():
                param.copy_(state[name].float())

    def _layout_params(self) -> list[tuple[str, torch.Tensor]]:
        names = [("fc.weight", self.fc.weight), ("fc.bias", self.fc.bias),
                 ("layers.0.post_attention_layernorm.weight", self.post_norm)]
        names += [(f"layers.0.self_attn.{p}.weight", getattr(self, p).weight)
                  for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
        names += [(f"layers.0.mlp.{p}.weight", getattr(self, p).weight) for p in ("gate_proj", "up_proj", "down_proj")]
        return names

    def state_in_layout(self) -> dict[str, torch.Tensor]:
        """Weights under SafeAILab's EAGLE-1 names, bfloat16."""
        return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in self._layout_params()}


def head_loss(head: TrainingHead, target: LlamaForCausalLM, batch: torch.Tensor, noise: float, steps: int
              ) -> torch.Tensor:
    """Feature regression plus 0.1 KL to the target's next-token distribution, summed over `steps` unrolled
    draft steps (weights 0.8^s: the first drafts matter most)."""
    n = batch.shape[1] - steps
    with torch.no_grad():
        features = target.model(input_ids=batch).last_hidden_state  # post-norm: what lm_head reads
        embeds = [target.model.embed_tokens(batch[:, s:s + n]) for s in range(1, steps + 1)]
    inputs = features[:, :n] + (torch.rand_like(features[:, :n]) - 0.5) * 2 * noise
    outs = head.unrolled(embeds, inputs) if steps > 1 else [head(embeds[0], inputs)]
    loss = features.new_zeros(())
    for s, predicted in enumerate(outs, start=1):
        truth = features[:, s:s + n]
        with torch.no_grad():
            teacher = F.log_softmax(target.lm_head(truth), -1)
        student = F.log_softmax(target.lm_head(predicted), -1)
        kl = F.kl_div(student.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="batchmean")
        loss = loss + 0.8 ** (s - 1) * (F.smooth_l1_loss(predicted, truth) + 0.1 * kl)
    return loss


def save_head(head: TrainingHead, target_dir: Path, out_dir: Path) -> None:
    """The head's weights and a one-layer Llama config.json (the target's dims), as SafeAILab ships them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config = json.loads((target_dir / "config.json").read_text())
    config.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"], torch_dtype="bfloat16")
    write_json(out_dir / "config.json", config)
    save_file(head.state_in_layout(), str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m minedraft.bench.tiny_pair.eagle", description=__doc__.splitlines()[0])
    p.add_argument("--target-dir", default=str(TINY_TARGET))
    p.add_argument("--out-dir", default=str(TINY_EAGLE))
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--noise", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--unroll", type=int, default=1, help="draft steps trained together (training-time test)")
    p.add_argument("--init", default="", help="start from this saved head's model.safetensors")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    target_dir = Path(args.target_dir)
    target = load_saved_model(target_dir)
    for p in target.parameters():
        p.requires_grad_(False)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    stream = concatenate_with_eos(encode_documents(tokenizer, load_corpus(0.02).train))
    head = TrainingHead(target)
    if args.init:
        head.load_layout(Path(args.init))
    settings = TrainSettings(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, peak_lr=args.lr,
                             warmup_steps=max(1, min(50, args.steps // 10)), min_lr_ratio=0.1, weight_decay=0.0,
                             log_every=25, seed=args.seed + 5)
    started = time.perf_counter()
    run_training("eagle", head, stream, settings, lambda batch: head_loss(head, target, batch, args.noise,
                                                                                args.unroll))
    save_head(head, target_dir, Path(args.out_dir))
    print(f"[eagle] {sum(p.numel() for p in head.parameters()):,} params saved to {args.out_dir} "
          f"in {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
