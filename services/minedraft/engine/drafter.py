"""Draft side of speculative decoding: propose k tokens per sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minedraft.engine.grammar import mask_logits
from minedraft.engine.sampling import STREAM_DRAFT, sample_tokens
from minedraft.engine.sequence_host import SequenceHost
from minedraft.engine.tetris import slot_scores, token_logq


@dataclass(slots=True)
class Proposal:
    """Draft tokens [B, k] and, for sampled rows, the distributions they came from."""

    tokens: torch.Tensor
    probs: torch.Tensor | None  # [B, k, V]; None when the whole batch is greedy
    scores: torch.Tensor | None = None  # [B, k] TETRIS slot scores, when the drafter was asked (`scoring`)
    lengths: list[int] | None = None  # drafts each row has verified, when ragged (tokens -1 past them)
    counts: torch.Tensor | None = None  # the same [B] on the device, for a selection that stayed there
    wanted: torch.Tensor | None = None  # how many drafts the budget alone would have kept (0-d), when selected there
    capacity: int = 0  # with counts: the most drafts they add up to (the verify's shape is sized for it)

    def read_counts(self) -> tuple[list[int], int] | None:
        """A device selection's per-row counts and wanted count on the host, in one readback (after the
        verdict's, so it costs no wait); they are kept in `lengths` from then on. A selection that kept every
        draft has no counts (it was verified as a plain proposal): every row's count is k. None: not
        selected there."""
        if self.wanted is None:
            return None
        if self.counts is None:
            return [self.tokens.shape[1]] * self.tokens.shape[0], int(self.wanted.item())
        values = torch.cat((self.counts, self.wanted.view(1))).tolist()
        self.lengths = values[:-1]
        return self.lengths, values[-1]


class Drafter(SequenceHost):
    """Owns the draft model's KV; rolls it back to the accepted prefix after each verdict (drafts pruned
    by TETRIS are rolled back like rejected ones: the verdict never accepts past a row's length)."""

    scoring = False  # also score each drafted slot for TETRIS selection (engine/tetris.py)
    window = 0  # the k of the last proposal: a commit keeps the KV blocks the next one of that k writes

    def propose(self, seq_ids: list[int], k: int) -> Proposal:
        """Run k draft forwards: the first feeds every uncached committed token, then one each."""
        states = [self.seqs[s] for s in seq_ids]
        for st in states:
            # Drafts of an earlier proposal that was never judged (a mode change or a drain
            # dropped it) are stale: feed at least the last committed token again.
            st.cached = min(st.cached, st.length - 1)
            self.runner.truncate(st.seq_id, max(st.cached, st.length + k - 1))  # the blocks it reserves below stay
        self.window = k
        lengths = self.runner.to_device(torch.tensor([st.length for st in states], dtype=torch.long))
        feed = [st.uncached() for st in states]
        reserve = [st.length + k - 1 for st in states]  # every feed's blocks at once: one table update
        logits = self.runner.forward(seq_ids, feed, [st.cached for st in states], last_n=1, reserve=reserve)
        proposal = self.draft_from(seq_ids, logits, lengths, k, reserve)
        for st in states:
            st.cached = st.length + k - 1
            self.prefix.publish(st)  # its committed tokens' KV is in: siblings may start from it
        return proposal

    def draft_from(self, seq_ids: list[int], logits: torch.Tensor, lengths: torch.Tensor, k: int,
                   reserve: list[int]) -> Proposal:
        """Sample k drafts per row from the logits after each row's last committed token (`lengths`: the
        rows' lengths, on the device); each draft but the last is fed back at lengths + i without a host
        round trip. `reserve[b]` bounds row b's KV positions."""
        sampling = self.sampling(seq_ids)
        ones = torch.ones_like(lengths)
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []  # stays empty for an all-greedy batch
        logq: list[tuple[torch.Tensor, torch.Tensor]] = []  # (drafted token's, largest) log q, when scoring
        grammar_rows = self.grammars.rows(seq_ids)  # masked one position at a time, on the host's matchers
        for i in range(k):
            if grammar_rows:
                logits = mask_logits(logits, grammar_rows, self.grammars.draft_mask(seq_ids, grammar_rows).unsqueeze(1))
            token, prob = sample_tokens(logits, sampling, (lengths + i).unsqueeze(1), STREAM_DRAFT)
            if grammar_rows:
                picked = token[:, 0].tolist()
                self.grammars.consume_drafts(seq_ids, grammar_rows, [picked[b] for b in grammar_rows])
            tokens.append(token[:, 0])
            if self.scoring:
                logq.append(token_logq(logits, token, prob))
            if prob is not None:
                probs.append(prob[:, 0])
            if i + 1 < k:
                logits = self.feed_draft(seq_ids, token, lengths + i, ones, reserve)
        if grammar_rows:
            self.grammars.rollback_drafts(seq_ids, grammar_rows)  # drafts are not output until verified
        scores = slot_scores(*(torch.stack(t, dim=1) for t in zip(*logq, strict=True))) if logq else None
        return Proposal(torch.stack(tokens, dim=1), torch.stack(probs, dim=1) if probs else None, scores)

    def feed_draft(self, seq_ids: list[int], token: torch.Tensor, position: torch.Tensor, ones: torch.Tensor,
                   reserve: list[int]) -> torch.Tensor:
        """Logits after feeding each row's newest draft [B, 1], the token at `position` [B]."""
        return self.runner.forward_on_device(seq_ids, token, position, ones, reserve, last_n=1)

    def commit(self, seq_id: int, new_tokens: list[int], accepted: int,
               hidden: tuple[int, torch.Tensor] | None = None) -> None:
        """Append the verifier's tokens; keep KV only for drafts that were accepted (the blocks of the positions the
        next proposal of the same k writes stay: releasing them would have that proposal take them again, churning
        the allocator and the block table). `hidden`, the target's states from a given position
        (engine/hidden_rows.py), is for an EAGLE head; a draft model needs none."""
        st = self.seqs[seq_id]
        st.cached = min(st.cached, st.length + accepted)
        st.tokens.extend(new_tokens)
        self.runner.truncate(seq_id, max(st.cached, st.length + self.window - 1) if self.window else st.cached)
        self.prefix.publish(st)
        self.grammars.commit(seq_id, new_tokens)
