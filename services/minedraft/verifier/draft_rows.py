"""The drafts a verify step checks, as a Proposal in the order of its verify batch."""

from __future__ import annotations

import torch

from minedraft.engine.drafter import Proposal
from minedraft.engine.transfer import to_device
from minedraft.worker.data_frames import DraftPayload


def align_drafts(payload: DraftPayload, seq_ids: list[int]) -> Proposal:
    """Rows of the draft payload in the order of this step's verify batch (a TETRIS selection's host lengths
    or device counts follow their rows)."""
    if list(payload.seq_ids) == seq_ids:  # the usual case: both batches list sequences in id order
        return Proposal(payload.tokens, payload.probs, lengths=payload.lengths, counts=payload.counts,
                        wanted=payload.wanted, capacity=payload.capacity)
    row_of = {s: i for i, s in enumerate(payload.seq_ids)}
    missing = [s for s in seq_ids if s not in row_of]
    if missing:
        raise RuntimeError(f"plan asks to verify sequences {missing} that were not drafted")
    rows = to_device(torch.tensor([row_of[s] for s in seq_ids], dtype=torch.long), payload.tokens.device)
    probs = payload.probs[rows] if payload.probs is not None else None
    lengths = [payload.lengths[row_of[s]] for s in seq_ids] if payload.lengths is not None else None
    counts = payload.counts[rows] if payload.counts is not None else None
    return Proposal(payload.tokens[rows], probs, lengths=lengths, counts=counts, wanted=payload.wanted,
                    capacity=payload.capacity)
