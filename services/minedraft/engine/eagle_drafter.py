"""Drafting with an EAGLE head: the Drafter whose forwards read the target's hidden states.

Draft position p is the pair (token p+1, the target's state at p), so a sequence of L committed tokens
has true pairs for positions 0..L-2, and the head's output at L-2 drafts token L. Each verdict brings
the target's states for the positions it computed since the last one (hidden_rows.py); `commit` keeps
those of committed positions in a per-sequence stash (eagle_stash.py: one device buffer that a batch's
commits write and a proposal's first forward reads in one op each), and the next `propose` feeds them,
then drafts k tokens, feeding each draft back with the head's own output as its state. The first forward's
features are gathered straight into the static buffer its CUDA graph reads (eagle_runner.py); its tokens
and the rows' lengths go up in one upload, its starts and query lengths with the graph's block tables.

`st.cached` counts the positions holding true pairs only. A position whose state has not arrived yet (a
new sequence drafts before its first verdict; the target computes its prompt in the same step) is fed
with zeros and stays uncached, so it is fed again once its state comes: still exact, as every draft is
judged by the target, only acceptance drops for that step (MineDraft zero-fills missing rows too). States
the target never computes (its prefix cache held them) are zero-filled for good.
"""

from __future__ import annotations

import numpy as np
import torch

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.drafter import Drafter, Proposal
from minedraft.engine.eagle_prefix import ShiftedPrefixCaching
from minedraft.engine.eagle_runner import EagleRunner
from minedraft.engine.eagle_stash import EagleStash
from minedraft.engine.hidden_rows import HiddenRows


class EagleDrafter(Drafter):
    def __init__(self, runner: EagleRunner, window: int = 16) -> None:
        super().__init__(runner)
        self.head_runner = runner
        self.prefix = ShiftedPrefixCaching(runner.allocator)
        dtype = runner.head.embed_tokens.weight.dtype
        self.stash = EagleStash(self.feature_width, dtype, torch.device(runner.device), window)
        self.features_received = 0  # positions whose target state arrived (what the checksum test reads)
        self.head_out: torch.Tensor | None = None  # the head's output of the last draft step [B, 1, h]
        self.drafted: dict[int, int] = {}  # k of the proposal each sequence awaits the verdict of

    @property
    def feature_width(self) -> int:
        return self.head_runner.head.eagle.feature_width

    def add(self, seq_id: int, tokens: list[int], params: SamplingParams, prompt_len: int | None = None,
            **cache: object) -> None:
        super().add(seq_id, tokens, params, prompt_len, **cache)  # type: ignore[arg-type]
        self.stash.drop(seq_id)
        self.drafted.pop(seq_id, None)

    def remove(self, seq_id: int) -> None:
        super().remove(seq_id)
        self.stash.drop(seq_id)
        self.drafted.pop(seq_id, None)

    def prefill(self, chunks: list[tuple[int, int]]) -> int:
        """Nothing to compute yet: a chunk's states are the target's, and come with the first verdict."""
        return 0

    def propose(self, seq_ids: list[int], k: int) -> Proposal:
        states = [self.seqs[s] for s in seq_ids]
        starts, lens, covered, lengths = [], [], [], []
        for st in states:
            length = st.length
            last = max(length - 2, 0)  # the newest true pair (a one-token sequence has none: fed anyway)
            start = min(st.cached, last)  # at least the newest pair again: its output starts the drafts
            first, end = self.stash.span(st.seq_id) or (start, start)
            lo, hi = max(start, first), min(last + 1, end)
            starts.append(start)
            lens.append(last - start + 1)
            lengths.append(length)
            covered.append(hi - lo if hi > lo and lo == start else 0)
            self.runner.truncate(st.seq_id, start)
        batch, width = len(states), max(lens)
        host = np.zeros(batch * (width + 1), dtype=np.int64)  # the pairs' tokens [B, width], then the lengths
        ids = host[: batch * width].reshape(batch, width)
        for b, (st, start, n) in enumerate(zip(states, starts, lens, strict=True)):
            ids[b, :n] = st.tokens[start + 1 : start + 1 + n] or st.tokens[-1:]
        host[batch * width :] = lengths
        sent = self.runner.to_device(torch.from_numpy(host))  # one upload for both
        slot = self.head_runner.first_features(batch, width)  # its graph's input buffer, if one replays it
        features = self.stash.gather(seq_ids, starts, covered, width, slot)
        reserve = [length + k for length in lengths]
        logits, self.head_out = self.head_runner.forward_features(seq_ids, sent[: batch * width].view(batch, width),
                                                              features, starts, lens, reserve)
        proposal = self.draft_from(seq_ids, logits, sent[batch * width :], k, reserve)
        for st, start, n in zip(states, starts, covered, strict=True):
            st.cached = start + n
            self.stash.retire(st.seq_id, st.cached - 1)
            self.prefix.publish(st)
            self.drafted[st.seq_id] = k
        self.head_out = None
        return proposal

    def feed_draft(self, seq_ids: list[int], token: torch.Tensor, position: torch.Tensor, ones: torch.Tensor,
                   reserve: list[int]) -> torch.Tensor:
        """Draft token at `position` goes to draft position - 1 (never negative: a draft follows a committed token),
        with the head's previous output as its state."""
        assert self.head_out is not None
        logits, self.head_out = self.head_runner.forward_features(seq_ids, token, self.head_out, position - 1,
                                                                  ones, reserve)
        return logits

    def commit(self, seq_id: int, new_tokens: list[int], accepted: int,
               hidden: tuple[int, torch.Tensor] | None = None) -> None:
        """Append the verifier's tokens; the drafted positions were never true pairs, so no KV is kept for
        them. `hidden`: the target's states from a position on, of which the committed ones are stashed (on
        the device with the next read, with the other sequences' of the batch)."""
        st = self.seqs[seq_id]
        st.tokens.extend(new_tokens)
        self.drafted.pop(seq_id, None)
        self.runner.truncate(seq_id, st.cached)
        self.prefix.publish(st)
        self.grammars.commit(seq_id, new_tokens)
        if hidden is not None:
            start, rows = hidden
            kept = rows[: max(0, st.length - 1 - start)]  # the true pairs: positions below length - 1
            self.features_received += kept.shape[0]
            self.stash.put(seq_id, st.cached, start, kept)

    def commit_batch(self, seq_ids: list[int], new_tokens: list[list[int]], accepted: list[int],
                     hidden: HiddenRows | None = None) -> None:
        """`commit` of a verdict's rows: row b's states are hidden's run b."""
        parts = hidden.split() if hidden is not None else [None] * len(seq_ids)
        for seq_id, tokens, n, part in zip(seq_ids, new_tokens, accepted, parts, strict=True):
            self.commit(seq_id, tokens, n, part)
