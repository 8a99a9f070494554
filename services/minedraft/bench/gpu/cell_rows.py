"""What a step cell's rows ask for (greedy, penalised, sampled or with logprobs), and the draft probabilities
that come with sampled rows' drafts (bench/gpu/step_cells.py)."""

from __future__ import annotations

import torch

from minedraft.proto import control_pb2


def row_spec(seq_id: int, tokens: list[int], sampling: str = "greedy", seed: int = 0) -> control_pb2.SeqSpec:
    """A greedy row; `penalties`: with the penalties the sampling-features bench uses (bench/sampling_features.py);
    `sampled`: drawn at temperature 0.8 with its own seed; `logprobs`: greedy, asking for its top 5 logprobs."""
    spec = control_pb2.SeqSpec(seq_id=seq_id, tokens=tokens, prompt_len=len(tokens))
    spec.sampling.top_p = 1.0
    if sampling == "penalties":
        spec.sampling.repetition_penalty = 1.1
        spec.sampling.frequency_penalty = 0.5
        spec.sampling.presence_penalty = 0.5
    if sampling == "logprobs":
        spec.sampling.logprobs = 5
    if sampling == "sampled":
        spec.sampling.temperature = 0.8
        spec.sampling.seed = seed
    return spec


def draft_probs(batch: int, k: int, vocab: int, device: torch.device) -> torch.Tensor:
    """Fixed draft probabilities [batch, k, vocab] for sampled rows' drafts (each slot a distribution), as the
    draft service sends them after a frame whose batch samples."""
    q = torch.rand((batch, k, vocab), device=device, dtype=torch.float32)
    return q / q.sum(dim=-1, keepdim=True)
