"""Draft side of speculative decoding: propose k tokens per sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minedraft.engine.sampling import STREAM_DRAFT, sample_tokens
from minedraft.engine.sequence_host import SequenceHost


@dataclass(slots=True)
class Proposal:
    """Draft tokens [B, k] and, for sampled rows, the distributions they came from."""

    tokens: torch.Tensor
    probs: torch.Tensor | None  # [B, k, V]; None when the whole batch is greedy


class Drafter(SequenceHost):
    """Owns the draft model's KV; rolls it back to the accepted prefix after each verdict."""

    def propose(self, seq_ids: list[int], k: int) -> Proposal:
        """Run k draft forwards: the first feeds every uncached committed token, then one each."""
        states = [self.seqs[s] for s in seq_ids]
        for st in states:
            # Drafts of an earlier proposal that was never judged (a mode change or a drain
            # dropped it) are stale: feed at least the last committed token again.
            st.cached = min(st.cached, st.length - 1)
            self.runner.truncate(st.seq_id, st.cached)
        sampling = self.sampling(seq_ids)
        lengths = self.runner.to_device(torch.tensor([st.length for st in states], dtype=torch.long))
        feed = [st.uncached() for st in states]
        logits = self.runner.forward(seq_ids, feed, [st.cached for st in states], last_n=1)
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []  # stays empty for an all-greedy batch
        for i in range(k):
            token, prob = sample_tokens(logits, sampling, (lengths + i).unsqueeze(1), STREAM_DRAFT)
            tokens.append(token[:, 0])
            if prob is not None:
                probs.append(prob[:, 0])
            if i + 1 < k:  # the next token stays on the device: no host round trip between draft steps
                starts = [st.length + i for st in states]
                logits = self.runner.forward_ids(seq_ids, token, starts, [1] * len(states), last_n=1)
        for st in states:
            st.cached = st.length + k - 1
        draft_tokens = torch.stack(tokens, dim=1)
        draft_probs = torch.stack(probs, dim=1) if probs else None
        return Proposal(draft_tokens, draft_probs)

    def commit(self, seq_id: int, new_tokens: list[int], accepted: int) -> None:
        """Append the verifier's tokens; keep KV only for drafts that were accepted."""
        st = self.seqs[seq_id]
        st.cached = min(st.cached, st.length + accepted)
        st.tokens.extend(new_tokens)
        self.runner.truncate(seq_id, st.cached)
