"""Drafting with an EAGLE head: the Drafter whose forwards read the target's hidden states.

Draft position p is the pair (token p+1, the target's state at p), so a sequence of L committed tokens
has true pairs for positions 0..L-2, and the head's output at L-2 drafts token L. Each verdict brings
the target's states for the positions it computed since the last one (hidden_rows.py); `commit` keeps
those of committed positions in a per-sequence stash, and the next `propose` feeds them, then drafts k
tokens, feeding each draft back with the head's own output as its state.

`st.cached` counts the positions holding true pairs only. A position whose state has not arrived yet (a
new sequence drafts before its first verdict; the target computes its prompt in the same step) is fed
with zeros and stays uncached, so it is fed again once its state comes: still exact, as every draft is
judged by the target, only acceptance drops for that step (MineDraft zero-fills missing rows too). States
the target never computes (its prefix cache held them) are zero-filled for good.
"""

from __future__ import annotations

import torch

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.drafter import Drafter, Proposal
from minedraft.engine.eagle_prefix import ShiftedPrefixCaching
from minedraft.engine.eagle_runner import EagleRunner


class EagleDrafter(Drafter):
    def __init__(self, runner: EagleRunner) -> None:
        super().__init__(runner)
        self.head_runner = runner
        self.prefix = ShiftedPrefixCaching(runner.allocator)
        self.stash: dict[int, tuple[int, torch.Tensor]] = {}  # first position, target states [n, F]
        self.features_received = 0  # positions whose target state arrived (what the checksum test reads)
        self._out: torch.Tensor | None = None  # the head's output of the last draft step [B, 1, h]

    @property
    def feature_width(self) -> int:
        return self.head_runner.head.eagle.feature_width

    def add(self, seq_id: int, tokens: list[int], params: SamplingParams, prompt_len: int | None = None,
            **cache: object) -> None:
        super().add(seq_id, tokens, params, prompt_len, **cache)  # type: ignore[arg-type]
        self.stash.pop(seq_id, None)

    def remove(self, seq_id: int) -> None:
        super().remove(seq_id)
        self.stash.pop(seq_id, None)

    def prefill(self, chunks: list[tuple[int, int]]) -> int:
        """Nothing to compute yet: a chunk's states are the target's, and come with the first verdict."""
        return 0

    def propose(self, seq_ids: list[int], k: int) -> Proposal:
        states = [self.seqs[s] for s in seq_ids]
        device = self.runner.device
        rows = []
        for st in states:
            last = max(st.length - 2, 0)  # the newest true pair (a one-token sequence has none: fed anyway)
            start = min(st.cached, last)  # at least the newest pair again: its output starts the drafts
            first, known = self.stash.get(st.seq_id, (start, torch.zeros((0, self.feature_width), device=device)))
            lo, hi = max(start, first), min(last + 1, first + known.shape[0])
            covered = known[lo - first:hi - first] if hi > lo and lo == start else known[:0]
            rows.append((st, start, last, covered))
            self.runner.truncate(st.seq_id, start)
        width = max(last - start + 1 for _, start, last, _ in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        features = torch.zeros((len(rows), width, self.feature_width), device=device)
        for b, (st, start, last, covered) in enumerate(rows):
            pairs = st.tokens[start + 1:last + 2] or st.tokens[-1:]
            ids[b, :len(pairs)] = torch.tensor(pairs, dtype=torch.long)
            features[b, :covered.shape[0]] = covered
        lens = [last - start + 1 for _, start, last, _ in rows]
        reserve = [st.length + k for st in states]
        logits, self._out = self.head_runner.forward_features(seq_ids, self.runner.to_device(ids), features,
                                                              [start for _, start, _, _ in rows], lens, reserve)
        lengths = self.runner.to_device(torch.tensor([st.length for st in states], dtype=torch.long))
        proposal = self.draft_from(seq_ids, logits, lengths, k, reserve)
        for st, start, _, covered in rows:
            st.cached = start + covered.shape[0]
            self._retire(st.seq_id, st.cached - 1)
            self.prefix.publish(st)
        self._out = None
        return proposal

    def feed_draft(self, seq_ids: list[int], token: torch.Tensor, position: torch.Tensor, ones: torch.Tensor,
                   reserve: list[int]) -> torch.Tensor:
        """Draft token at `position` goes to draft position - 1, with the head's previous output as its state."""
        assert self._out is not None
        logits, self._out = self.head_runner.forward_features(seq_ids, token, self._out, (position - 1).clamp(min=0),
                                                              ones, reserve)
        return logits

    def commit(self, seq_id: int, new_tokens: list[int], accepted: int,
               hidden: tuple[int, torch.Tensor] | None = None) -> None:
        """Append the verifier's tokens; the drafted positions were never true pairs, so no KV is kept for
        them. `hidden`: the target's states from a position on, of which the committed ones are stashed."""
        st = self.seqs[seq_id]
        st.tokens.extend(new_tokens)
        self.runner.truncate(seq_id, st.cached)
        self.prefix.publish(st)
        self.grammars.commit(seq_id, new_tokens)
        if hidden is not None:
            self._stash(seq_id, hidden[0], hidden[1], st.length - 1)

    def _stash(self, seq_id: int, start: int, rows: torch.Tensor, limit: int) -> None:
        """Keep the states of positions start.. below `limit` (the true pairs), after what is stashed."""
        st = self.seqs[seq_id]
        device = self.runner.device
        first, known = self.stash.get(seq_id, (st.cached, torch.zeros((0, self.feature_width), device=device)))
        end = first + known.shape[0]
        rows = rows[: max(0, limit - start)].to(device, torch.float32)
        self.features_received += rows.shape[0]
        parts = [known]
        if start > end:  # the target never computed these (its prefix cache had them): zeros for good
            parts.append(torch.zeros((start - end, known.shape[1]), device=device))
            parts.append(rows)
        elif start + rows.shape[0] > end:
            parts.append(rows[end - start:])
        self.stash[seq_id] = (first, torch.cat(parts) if len(parts) > 1 else known)

    def _retire(self, seq_id: int, keep_from: int) -> None:
        """Drop stashed states before `keep_from` (fed for good); the newest fed one stays for a re-feed."""
        if seq_id not in self.stash:
            return
        first, known = self.stash[seq_id]
        drop = min(max(0, keep_from - first), known.shape[0])
        self.stash[seq_id] = (first + drop, known[drop:])
