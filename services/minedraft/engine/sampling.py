"""Sampling parameters, logits processing and per-request counter-based randomness.

Every random number a request consumes is a pure function of (its seed, the position of
the token being decided, the purpose of the draw). Draws therefore do not depend on which
batch a request lands in, how batches are rebalanced, or which process does the drawing:
the draft service and the verifier can each produce their share without sharing state.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.transfer import to_device

# Purposes of a random draw: one independent stream each.
STREAM_DRAFT = 1  # draft model samples a proposal
STREAM_ACCEPT = 2  # verifier's accept/reject coin
STREAM_TARGET = 3  # verifier samples a correction, bonus or plain AR token

_MASK32 = 0xFFFFFFFF


@dataclass(slots=True)
class BatchSampling:
    """Sampling parameters of a batch as tensors, one row per sequence.

    The batch-wide flags are computed from the Python parameters, so choosing a code path
    never reads a device tensor back (no host synchronisation inside a step).
    """

    temperature: torch.Tensor  # [B] float; 0 means greedy
    top_k: torch.Tensor  # [B] long; 0 disables
    top_p: torch.Tensor  # [B] float
    seed: torch.Tensor  # [B] long
    all_greedy: bool = False
    any_top_k: bool = False
    any_top_p: bool = False
    min_p: torch.Tensor | None = None  # [B] float; None when no sampled row asks for min_p

    @classmethod
    def from_params(cls, params: list[SamplingParams], device: torch.device | str = "cpu") -> BatchSampling:
        if all(p.greedy for p in params):  # the common case: no per-row tensor is ever read but `greedy`
            return cls(*_greedy_rows(len(params), str(device)), all_greedy=True)
        return cls(
            temperature=to_device(torch.tensor([p.temperature for p in params], dtype=torch.float32), device),
            top_k=to_device(torch.tensor([p.top_k for p in params], dtype=torch.long), device),
            top_p=to_device(torch.tensor([p.top_p for p in params], dtype=torch.float32), device),
            seed=to_device(torch.tensor([p.resolved_seed() for p in params], dtype=torch.long), device),
            all_greedy=all(p.greedy for p in params),
            any_top_k=any(p.top_k > 0 and not p.greedy for p in params),
            any_top_p=any(p.top_p < 1.0 and not p.greedy for p in params),
            min_p=(to_device(torch.tensor([p.min_p for p in params], dtype=torch.float32), device)
                   if any(p.min_p > 0 and not p.greedy for p in params) else None),
        )

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature == 0


@functools.lru_cache(maxsize=64)
def _greedy_rows(rows: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Constant parameter rows of an all-greedy batch (temperature 0, no top-k/top-p, seed 0),
    made once per batch size instead of four small tensors every step. Never written to."""
    zeros_f, ones_f = torch.zeros(rows, dtype=torch.float32), torch.ones(rows, dtype=torch.float32)
    zeros_l = torch.zeros(rows, dtype=torch.long)
    return (to_device(zeros_f, device), to_device(zeros_l, device), to_device(ones_f, device),
            to_device(zeros_l.clone(), device))


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer avalanche hash on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def _hash_draw(seed: torch.Tensor, position: torch.Tensor, stream: int, lane: int) -> torch.Tensor:
    seed_lo = seed & _MASK32
    seed_hi = (seed >> 32) & _MASK32
    h = _mix32(torch.full_like(position, (stream * 0x9E3779B9 + lane * 0x85EBCA6B) & _MASK32))
    h = _mix32(h ^ (position & _MASK32))
    h = _mix32(h ^ seed_hi)
    return _mix32(h ^ seed_lo)


def uniforms(seed: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """U[0, 1) in float64 with 53 random bits, for seeds [B] and positions [B, ...]."""
    seed = seed.view(-1, *([1] * (positions.dim() - 1))).expand_as(positions)
    hi = _hash_draw(seed, positions, stream, 0) >> 5  # 27 bits
    lo = _hash_draw(seed, positions, stream, 1) >> 6  # 26 bits
    return (hi.double() * 67108864.0 + lo.double()) / 9007199254740992.0


def processed_probs(logits: torch.Tensor, sampling: BatchSampling) -> torch.Tensor:
    """Probabilities after temperature, min_p, top-k and top-p: logits [B, T, V] -> probs [B, T, V].

    Draft and target go through this same function, so both sides of the acceptance test
    describe the distributions under identical parameters. Greedy rows get temperature 1;
    their probabilities are only used through argmax.
    """
    logits = logits.float()
    temp = torch.where(sampling.greedy, torch.ones_like(sampling.temperature), sampling.temperature)
    logits = logits / temp.view(-1, 1, 1)
    if sampling.min_p is not None:  # keep tokens at least min_p times as likely as the most likely one
        probs = torch.softmax(logits, dim=-1)
        floor = probs.amax(dim=-1, keepdim=True) * sampling.min_p.view(-1, 1, 1)
        logits = logits.masked_fill(probs < floor, float("-inf"))
    vocab = logits.shape[-1]
    needs_top_k = sampling.any_top_k
    needs_top_p = sampling.any_top_p
    if needs_top_k or needs_top_p:
        sorted_logits, _ = logits.sort(dim=-1, descending=True)
        if needs_top_k:
            k = torch.where(sampling.top_k > 0, sampling.top_k.clamp(max=vocab), torch.full_like(sampling.top_k, vocab))
            kth = sorted_logits.gather(-1, (k - 1).view(-1, 1, 1).expand(*logits.shape[:-1], 1))
            logits = logits.masked_fill(logits < kth, float("-inf"))
            sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
        if needs_top_p:
            sorted_probs = torch.softmax(sorted_logits, dim=-1)
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            cut = mass_before >= sampling.top_p.view(-1, 1, 1)
            cut[..., 0] = False
            # The smallest kept logit is the threshold; ties with it are kept too.
            threshold = sorted_logits.masked_fill(cut, float("inf")).amin(dim=-1, keepdim=True)
            logits = logits.masked_fill(logits < threshold, float("-inf"))
    return torch.softmax(logits, dim=-1)


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: probs [..., V] with one uniform per row [...] -> token ids [...]."""
    cdf = probs.double().cumsum(dim=-1)
    target = (u * cdf[..., -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return idx.clamp(max=probs.shape[-1] - 1)


def sample_tokens(
    logits: torch.Tensor, sampling: BatchSampling, positions: torch.Tensor, stream: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sample (or argmax for greedy rows) from logits [B, T, V]; returns tokens [B, T] and the
    processed probabilities (None when the whole batch is greedy: nothing needs them)."""
    greedy_tokens = logits.argmax(dim=-1)
    if sampling.all_greedy:
        return greedy_tokens, None
    probs = processed_probs(logits, sampling)
    drawn = sample_from(probs, uniforms(sampling.seed, positions, stream))
    return torch.where(sampling.greedy.view(-1, 1), greedy_tokens, drawn), probs
