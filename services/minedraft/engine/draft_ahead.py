"""Drafting a batch before its verdict is read on the host.

After a proposal of kd tokens, a sequence of L committed tokens has KV for positions 0..L+kd-2 (its
committed tokens and the first kd-1 drafts). The verdict accepts a of the drafts and adds one token b
of its own, so the sequence grows to L' = L + a + 1 and ends with d_a (t_{L-1} when a = 0) and b at
positions L'-2 and L'-1. Whatever a is, feeding those two tokens at L'-2 brings the KV up to date:
position L'-2 is already cached unless a = kd (then it holds d_kd, never fed), and writing it again
stores the same keys. So the next proposal's first forward has one shape (two tokens per row) for
every outcome, and its tokens, positions and sampling positions are gathers over the verdict on the
device: the host queues all k forwards without knowing a, and settles its bookkeeping later, once
the verdict is read back, to what `Drafter.commit` followed by `Drafter.propose` would have left.
"""

from __future__ import annotations

import torch

from minedraft.engine.drafter import Drafter, Proposal


def awaited_k(drafter: Drafter, seq_id: int) -> int:
    """kd of the proposal whose verdict the sequence awaits (its KV runs kd-1 past its tokens); 0 when
    it awaits none or is unknown."""
    st = drafter.seqs.get(seq_id)
    return st.cached - st.length + 1 if st is not None and st.cached >= st.length else 0


def room_to_draft_ahead(drafter: Drafter, seq_ids: list[int], kd: int, k: int) -> bool:
    """Whether every row's worst case (all kd accepted, then k drafts) fits the model and the free KV."""
    limits = [drafter.seqs[s].length + kd + k for s in seq_ids]
    if max(limits) > drafter.runner.config.max_position_embeddings:
        return False
    alloc = drafter.runner.allocator
    need = sum(alloc.extra_blocks_needed(s, n) for s, n in zip(seq_ids, limits, strict=True))
    return need <= alloc.num_free


def propose_ahead(drafter: Drafter, seq_ids: list[int], kd: int, k: int, accepted: torch.Tensor,
                  verdict_tokens: torch.Tensor) -> Proposal:
    """k drafts per row from a verdict still on the device: accepted [B], verdict_tokens [B, kd+1]."""
    states = [drafter.seqs[s] for s in seq_ids]
    runner = drafter.runner
    host = torch.tensor([[st.length for st in states], [st.tokens[-1] for st in states]], dtype=torch.long)
    lengths, last = runner.to_device(host)
    acc = accepted.long()
    rows = torch.arange(len(states), device=acc.device)
    new_len = lengths + acc + 1
    bonus = verdict_tokens[rows, acc]
    before = torch.where(acc > 0, verdict_tokens[rows, (acc - 1).clamp(min=0)], last)
    reserve = [st.length + kd + k for st in states]
    logits = runner.forward_on_device(seq_ids, torch.stack((before, bonus), dim=1), new_len - 2,
                                      torch.full_like(new_len, 2), reserve, last_n=1)
    return drafter.draft_from(seq_ids, logits, new_len, k, reserve)


def settle(drafter: Drafter, seq_ids: list[int], rows: list[list[int]], accepted: list[int], k: int) -> None:
    """The host's side of a proposal made ahead: append each verdict's tokens and mark the k-1 new
    drafts as cached; blocks past them go back (the queued forwards write none of them)."""
    for seq_id, row, n in zip(seq_ids, rows, accepted, strict=True):
        st = drafter.seqs[seq_id]
        st.tokens.extend(row[: n + 1])
        st.cached = st.length + k - 1
        drafter.runner.truncate(seq_id, st.cached)
        drafter.prefix.publish(st)
