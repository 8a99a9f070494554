"""Lossless speculative acceptance (Leviathan et al. 2023; Chen et al. 2023), vectorized.

Draft token x_i ~ q_i is kept when u_i * q_i(x_i) <= p_i(x_i); at the first rejection the
replacement is drawn from norm(max(0, p_i - q_i)); when all k survive, a bonus token is
drawn from p_{k+1}. Greedy rows keep drafts while they equal argmax p and then emit the
argmax. No Python loop runs over tokens or over the batch.

Ragged rows (TETRIS, engine/tetris.py) verify only their first `lengths[b]` drafts: slots at and past
the length are never accepted, so the bonus token sits at the first rejection or at the length, and
the residual there has q zero (it is plain p), as at slot k of a full row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minedraft.engine.sampling import STREAM_ACCEPT, STREAM_TARGET, BatchSampling, sample_from, uniforms


@dataclass(slots=True)
class Verdict:
    """Outcome per sequence: `tokens[b, :counts[b]]` are appended (accepted drafts + one)."""

    tokens: torch.Tensor  # [B, k+1], padded with -1
    counts: torch.Tensor  # [B], in 1..k+1
    accepted: torch.Tensor  # [B], accepted draft tokens (counts - 1)
    packed: torch.Tensor | None = None  # [B, k+2]: accepted, then tokens (both views of it), as read back


def _packed(tokens: torch.Tensor, n_acc: torch.Tensor) -> Verdict:
    packed = torch.cat((n_acc.unsqueeze(1), tokens), dim=1)
    return Verdict(tokens=packed[:, 1:], counts=n_acc + 1, accepted=packed[:, 0], packed=packed)


def _greedy(target_argmax: torch.Tensor, accept: torch.Tensor, slot: torch.Tensor) -> Verdict:
    """Every kept draft equals the target's argmax at its slot, and the token after them is the argmax too:
    the verdict is the argmax row cut after the first disagreement (on CUDA one kernel:
    engine/cuda/greedy_verdict.py)."""
    n_acc = _first_rejection(accept)
    return _packed(torch.where(slot <= n_acc.unsqueeze(1), target_argmax, -1), n_acc)


def _greedy_on_cuda(target_argmax: torch.Tensor, drafts: torch.Tensor, lengths: torch.Tensor | None
                    ) -> Verdict | None:
    try:
        from minedraft.engine.cuda.greedy_verdict import greedy_verdict_triton
    except ImportError:  # no triton: the torch path
        return None
    packed, counts = greedy_verdict_triton(target_argmax, drafts, lengths)
    return Verdict(tokens=packed[:, 1:], counts=counts, accepted=packed[:, 0], packed=packed)


def _first_rejection(accept: torch.Tensor) -> torch.Tensor:
    """Number of leading True values per row of a [B, k] mask."""
    return accept.to(torch.int64).cumprod(dim=1).sum(dim=1)


def verify_drafts(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    target_logits: torch.Tensor,
    sampling: BatchSampling,
    positions: torch.Tensor | None,
    lengths: torch.Tensor | None = None,
) -> Verdict:
    """Judge drafts [B, k] against target distributions [B, k+1, V].

    positions [B, k+1] are the sequence positions the k+1 output slots would occupy; they
    key the per-request random draws (None when every row is greedy: nothing is drawn).
    draft_probs [B, k, V] may be None when every row is greedy. lengths [B] (None: every row k)
    bound how many drafts each row has verified; target slot lengths[b] must hold the
    distribution after those drafts (left-aligned rows).
    """
    batch, k = draft_tokens.shape
    target_argmax = target_logits.argmax(dim=-1)  # [B, k+1]
    on_cuda = sampling.all_greedy and target_argmax.is_cuda
    if on_cuda and (verdict := _greedy_on_cuda(target_argmax, draft_tokens, lengths)) is not None:
        return verdict
    accept = draft_tokens == target_argmax[:, :k]
    slot = torch.arange(k + 1, device=draft_tokens.device).unsqueeze(0)
    if lengths is not None:
        accept &= slot[:, :k] < lengths.unsqueeze(1)
    if sampling.all_greedy:
        return _greedy(target_argmax, accept, slot)
    greedy = sampling.greedy
    assert positions is not None, "sampled rows need their positions"
    if draft_probs is not None:
        idx = draft_tokens.clamp(min=0).unsqueeze(-1)  # pruned slots (-1) are never accepted
        p_x = target_probs[:, :k].gather(-1, idx).squeeze(-1).double()
        q_x = draft_probs.gather(-1, idx).squeeze(-1).double()
        coin = uniforms(sampling.seed, positions[:, :k], STREAM_ACCEPT)
        accept = torch.where(greedy.view(-1, 1), accept, coin * q_x <= p_x)
        if lengths is not None:
            accept &= slot[:, :k] < lengths.unsqueeze(1)
    n_acc = _first_rejection(accept)  # [B]

    rows = torch.arange(batch, device=draft_tokens.device)
    final_greedy = target_argmax[rows, n_acc]
    p_last = target_probs[rows, n_acc]  # [B, V]
    if draft_probs is None:  # no drafts were judged: plain sampling from p
        residual = p_last
    else:
        q_last = draft_probs[rows, n_acc.clamp(max=k - 1)]
        last = k if lengths is None else lengths
        q_last = torch.where((n_acc < last).unsqueeze(1), q_last, 0.0)  # zero at the bonus slot: residual == p
        residual = (p_last - q_last).clamp(min=0)
        mass = residual.sum(dim=-1, keepdim=True)
        residual = torch.where(mass > 0, residual, p_last)
    u = uniforms(sampling.seed, positions[rows, n_acc], STREAM_TARGET)
    final = torch.where(greedy, final_greedy, sample_from(residual, u))

    pad = torch.full((batch, 1), -1, dtype=draft_tokens.dtype, device=draft_tokens.device)
    padded_drafts = torch.cat((draft_tokens, pad), dim=1)
    tokens = torch.where(slot < n_acc.unsqueeze(1), padded_drafts, torch.full_like(padded_drafts, -1))
    tokens = torch.where(slot == n_acc.unsqueeze(1), final.unsqueeze(1), tokens)
    return _packed(tokens, n_acc)
