"""One training loop for both phases: the target on next-token loss, the draft distilled from it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM


@dataclass(frozen=True)
class TrainSettings:
    """Optimiser and schedule settings of one training phase."""

    steps: int
    batch_size: int
    seq_len: int
    peak_lr: float
    warmup_steps: int
    min_lr_ratio: float
    weight_decay: float
    log_every: int
    seed: int


@dataclass
class PhaseResult:
    """What one training phase measured."""

    steps: int
    seconds: float
    final_loss: float
    tokens_seen: int


def cosine_lr_factor(step: int, settings: TrainSettings) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio`` of the peak LR."""
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return settings.min_lr_ratio + (1.0 - settings.min_lr_ratio) * cosine


def build_optimizer(
    model: torch.nn.Module, settings: TrainSettings
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with weight decay on matrices only, plus the warmup+cosine schedule."""
    matrices = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": matrices, "weight_decay": settings.weight_decay},
            {"params": vectors, "weight_decay": 0.0},
        ],
        lr=settings.peak_lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: cosine_lr_factor(step, settings)
    )
    return optimizer, scheduler


def sample_windows(
    stream: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> torch.Tensor:
    """Random ``seq_len + 1``-token windows of the stream (inputs plus shifted labels)."""
    starts = torch.randint(0, stream.numel() - seq_len - 1, (batch_size,), generator=generator)
    return torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()])


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of next-token logits against labels."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


def distillation_loss(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    labels: torch.Tensor,
    ce_weight: float,
) -> torch.Tensor:
    """``(1 - w) * KL(target || draft) + w * CE(draft, data)``, averaged per token."""
    vocab = draft_logits.size(-1)
    draft_logp = F.log_softmax(draft_logits.reshape(-1, vocab), dim=-1)
    target_logp = F.log_softmax(target_logits.reshape(-1, vocab), dim=-1)
    kl = F.kl_div(draft_logp, target_logp, log_target=True, reduction="batchmean")
    ce = F.nll_loss(draft_logp, labels.reshape(-1))
    return (1.0 - ce_weight) * kl + ce_weight * ce


def log_progress(name: str, step: int, settings: TrainSettings, loss: float, start: float) -> None:
    """Print one progress line."""
    elapsed = time.perf_counter() - start
    print(f"[{name}] step {step:5d}/{settings.steps} loss {loss:.4f} elapsed {elapsed:6.1f}s", flush=True)


def run_training(
    name: str,
    model: LlamaForCausalLM,
    stream: torch.Tensor,
    settings: TrainSettings,
    loss_of: Callable[[torch.Tensor], torch.Tensor],
) -> PhaseResult:
    """The loop both phases share: random windows, AdamW with warmup+cosine, clipped grads."""
    generator = torch.Generator().manual_seed(settings.seed)
    optimizer, scheduler = build_optimizer(model, settings)
    model.train()
    start = time.perf_counter()
    running = 0.0
    for step in range(settings.steps):
        loss = loss_of(sample_windows(stream, settings.batch_size, settings.seq_len, generator))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        running = loss.item() if step == 0 else 0.9 * running + 0.1 * loss.item()
        if (step + 1) % settings.log_every == 0 or step + 1 == settings.steps:
            log_progress(name, step + 1, settings, running, start)
    model.eval()
    seconds = time.perf_counter() - start
    return PhaseResult(settings.steps, seconds, running, settings.steps * settings.batch_size * settings.seq_len)


def train_target(model: LlamaForCausalLM, stream: torch.Tensor, settings: TrainSettings) -> PhaseResult:
    """Train the target with next-token cross-entropy on random windows."""

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        return next_token_loss(model(input_ids=batch[:, :-1]).logits, batch[:, 1:])

    return run_training("target", model, stream, settings, loss_of)


def train_draft(
    draft: LlamaForCausalLM,
    target: LlamaForCausalLM,
    stream: torch.Tensor,
    settings: TrainSettings,
    ce_weight: float,
) -> PhaseResult:
    """Distil the draft from the frozen target's logits on random windows."""
    target.eval()

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        inputs = batch[:, :-1]
        with torch.no_grad():
            target_logits = target(input_ids=inputs).logits
        return distillation_loss(draft(input_ids=inputs).logits, target_logits, batch[:, 1:], ce_weight)

    return run_training("draft", draft, stream, settings, loss_of)
