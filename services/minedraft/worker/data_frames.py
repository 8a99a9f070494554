"""What the data plane's payloads hold, and how a frame lays them out.

A payload travels as one fixed-size int64 frame (what does not fit follows it): a header of HEADER_SLOTS slots
(step, batch, k, has_probs, vocab, body length), then the body. Drafts: sequence ids, then the [B, k]
tokens, -1 past a row's length when TETRIS pruned it (q for sampled rows follows as its own float32
tensor). Verdicts: sequence ids, accepted counts,
then the [B, k+1] tokens, -1 padded; for an EAGLE head also each row's first position and count of target
hidden states (header slots 3 and 4: their width and total rows) and the code of their dtype
(HIDDEN_DTYPES: the target's own, bf16 on a GPU, so they cross the link at half float32's bytes), which
follow as one tensor.
A frame received into device memory can be used by views (the `Posted*` forms) before the host reads it;
its header is checked once it does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minedraft.engine.hidden_rows import HiddenRows

HEADER_SLOTS = 6  # step, batch, k, has_probs, vocab, body length
HIDDEN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # a verdict's hidden states, by code
FRAME_SLOTS = 8192  # int64 slots of a payload's first message (64 KiB): ~900 sequences at k = 6


@dataclass(slots=True)
class DraftPayload:
    step: int
    seq_ids: list[int]
    tokens: torch.Tensor  # [B, k]
    probs: torch.Tensor | None  # [B, k, V]
    lengths: list[int] | None = None  # TETRIS: drafts each row has verified (tokens -1 past them); None: all k
    counts: torch.Tensor | None = None  # a selection kept on the device (colocated): the same [B] there
    wanted: torch.Tensor | None = None  # ... and the drafts its floor and budget wanted (0-d): engine/drafter.py
    capacity: int = 0  # ... and the most drafts its counts add up to


@dataclass(slots=True)
class PostedDrafts:
    tokens: torch.Tensor  # [B, k] on the device, valid once the stream reaches them
    header: torch.Tensor  # step, batch, k, has_probs, vocab, body length, then the B sequence ids
    probs: torch.Tensor | None = None  # [B, k, V] draft probabilities when a row samples, likewise


def expected_header(step: int, seq_ids: list[int], k: int, vocab: int = 0) -> list[int]:
    """What a posted frame's header must hold for a payload of these sequences: all-greedy, or (`vocab`, the
    width of the probabilities that follow the frame) with a sampled row."""
    return [step, len(seq_ids), k, int(vocab > 0), vocab, len(seq_ids) * (k + 1), *seq_ids]


@dataclass(slots=True)
class PostedVerdict:
    frame: torch.Tensor  # the used part of the frame on the device: header, sequence ids, accepted, tokens (runs)
    accepted: torch.Tensor  # [B] and [B, k+1] (-1 padded) views, valid once the stream reaches them
    tokens: torch.Tensor
    hidden: torch.Tensor | None = None  # an EAGLE head's states, k+1 rows per sequence: [B * (k+1), F]


def verdict_slots(batch: int, k: int, hidden: bool) -> int:
    """Body slots of a verdict of `batch` rows of width k + 1 (with a head: its runs and dtype code too)."""
    return batch * (k + 3) + (2 * batch + 1 if hidden else 0)


def posted_verdict(frame: torch.Tensor, batch: int, k: int, hidden: torch.Tensor | None = None) -> PostedVerdict:
    """Device views of a posted verdict frame (`hidden`: the states received after it, when a head drafts)."""
    used = frame[: HEADER_SLOTS + verdict_slots(batch, k, hidden is not None)]
    body = used[HEADER_SLOTS + batch :]
    return PostedVerdict(used, body[:batch], body[batch : batch * (k + 2)].view(batch, k + 1), hidden)


def expected_verdict_header(step: int, seq_ids: list[int], k: int, hidden: tuple[list[int], int, int] | None = None
                            ) -> list[int]:
    """What a posted verdict frame's header must hold for a verdict on these sequences; with `hidden` (each
    row's first state position, the states' width and dtype code) the header's state fields and, after it,
    the runs every row's k + 1 states make (what `split_verdict_frame` leaves past the token rows)."""
    batch = len(seq_ids)
    if hidden is None:
        return [step, batch, k, 0, 0, verdict_slots(batch, k, False), *seq_ids]
    starts, width, code = hidden
    return [step, batch, k, width, batch * (k + 1), verdict_slots(batch, k, True), *seq_ids,
            *starts, *[k + 1] * batch, code]


def split_verdict_frame(frame: list[int], batch: int, k: int) -> tuple[list[int], list[int], list[list[int]]]:
    """A posted verdict frame read back: its header with the sequence ids (and a head's runs after them, what
    `expected_verdict_header` lists), accepted counts, token rows."""
    body = frame[HEADER_SLOTS + batch :]
    rows = [body[batch + i * (k + 1) : batch + (i + 1) * (k + 1)] for i in range(batch)]
    return frame[: HEADER_SLOTS + batch] + body[batch * (k + 2) :], body[:batch], rows


@dataclass(slots=True)
class VerdictPayload:
    step: int
    seq_ids: list[int]
    tokens: torch.Tensor  # [B, k+1], -1 padded (received: on the host)
    accepted: torch.Tensor  # [B]
    hidden: HiddenRows | None = None  # an EAGLE head's target states (received: on the draft's device)
