"""Drafting with an EAGLE head before its verdict is read on the host (the head's twin of draft_ahead.py).

A sequence of L committed tokens whose head holds true pairs through position L-2 (`cached` = L-1) has
proposed kd drafts; their verify computed the target's states at positions L-1 .. L+kd-1 (the last
committed token, then the drafts), which come with the verdict as kd+1 rows per sequence. Whatever number
a of the drafts it accepts, the new true pairs are positions L-1 .. L+a-1, pair p being (token p+1, state
p): the tokens are the verdict's row (the accepted drafts, then its own token) and the states its first
a+1 rows. So the next proposal's first forward feeds every row the verdict's kd+1 tokens and states at
L-1, a+1 of them valid (the query lengths come from the verdict on the device, so one shape serves every
outcome), and drafts k tokens from the last valid position's output. The host settles the stash and its
bookkeeping once it reads the verdict, to what `commit` followed by `propose` would have left.

The verifier ships each row's states computed since its last verdict; they are exactly the verify's kd+1
when the head has every state before the window (`can_draft_ahead`), which a receive of that size needs.
"""

from __future__ import annotations

import torch

from minedraft.engine.drafter import Proposal
from minedraft.engine.eagle_drafter import EagleDrafter


def awaited_k(drafter: EagleDrafter, seq_id: int) -> int:
    """kd of the proposal whose verdict the sequence awaits; 0 when it awaits none."""
    return drafter.drafted.get(seq_id, 0)


def can_draft_ahead(drafter: EagleDrafter, seq_ids: list[int]) -> bool:
    """Whether each row's verdict will carry its verify window's states and nothing else: the head holds true
    pairs through L-2 and the stash every state before the window (L: the row's committed tokens)."""
    for seq_id in seq_ids:
        st, span = drafter.seqs[seq_id], drafter.stash.span(seq_id)
        if st.cached != st.length - 1 or span is None or span[1] != st.length - 1:
            return False
    return True


def propose_ahead(drafter: EagleDrafter, seq_ids: list[int], kd: int, k: int, accepted: torch.Tensor,
                  verdict_tokens: torch.Tensor, states: torch.Tensor) -> Proposal:
    """k drafts per row from a verdict still on the device: accepted [B], verdict_tokens [B, kd+1] (-1 padded),
    states [B * (kd+1), F] (the target's, at positions L-1 .. L+kd-1 of each row)."""
    runner, rows = drafter.head_runner, [drafter.seqs[s] for s in seq_ids]
    batch, width = len(rows), kd + 1
    lengths = runner.to_device(torch.tensor([st.length for st in rows], dtype=torch.long))
    valid = accepted.long() + 1
    ids = verdict_tokens.clamp(min=0)  # the -1 padding past a row's tokens feeds nothing (past its length)
    features = states.view(batch, width, -1).to(runner.head_dtype)
    reserve = [st.length + kd + k for st in rows]  # the worst case: every draft accepted, then k drafts
    logits, drafter.head_out = runner.forward_features(seq_ids, ids, features, lengths - 1, valid, reserve)
    proposal = drafter.draft_from(seq_ids, logits, lengths + valid, k, reserve)
    drafter.head_out = None
    return proposal


def settle(drafter: EagleDrafter, seq_ids: list[int], rows: list[list[int]], accepted: list[int], k: int,
           states: torch.Tensor) -> None:
    """The host's side of a proposal made ahead: each row's verdict tokens appended, its committed states
    stashed (the newest kept for a re-feed), its true pairs cached through its new length - 2."""
    per_row = states.view(len(seq_ids), -1, states.shape[-1])
    for b, (seq_id, row, n) in enumerate(zip(seq_ids, rows, accepted, strict=True)):
        st = drafter.seqs[seq_id]
        first = st.length - 1
        st.tokens.extend(row[: n + 1])
        drafter.stash.put(seq_id, first, first, per_row[b, : n + 1])
        drafter.features_received += n + 1
        st.cached = st.length - 1
        drafter.stash.retire(seq_id, st.cached - 1)
        drafter.drafted[seq_id] = k
        drafter.prefix.publish(st)
