"""Target side of speculative decoding: score k+1 positions in one forward and judge."""

from __future__ import annotations

import torch

from minedraft.engine.drafter import Proposal
from minedraft.engine.readback import Readback
from minedraft.engine.rejection import Verdict, verify_drafts
from minedraft.engine.sampling import processed_probs
from minedraft.engine.sequence_host import SequenceHost


class Verifier(SequenceHost):
    """Owns the target model's KV and the rejection sampler.

    With k = 0 drafts the same step is plain autoregressive decoding (and prefill).
    """

    def verify(self, seq_ids: list[int], proposal: Proposal | None) -> Verdict:
        verdict = self.judge(seq_ids, proposal)
        self.commit(seq_ids, self.read_back(verdict))
        return verdict

    def judge(self, seq_ids: list[int], proposal: Proposal | None) -> Verdict:
        """Queue the scoring forward and the acceptance rule on the device; no host synchronisation
        in the steady state, so a caller can hand the verdict on (a data-plane send) while the GPU
        still runs, then `commit`."""
        states = [self.seqs[s] for s in seq_ids]
        device = self.runner.device
        if proposal is None:
            drafts = torch.zeros((len(seq_ids), 0), dtype=torch.long, device=device)
            draft_probs = None
        else:
            drafts, draft_probs = proposal.tokens.to(device), proposal.probs
        k = drafts.shape[1]
        logits = self._score(states, drafts)
        sampling = self.sampling(seq_ids)
        lengths = self.runner.to_device(torch.tensor([st.length for st in states], dtype=torch.long))
        positions = lengths.unsqueeze(1) + torch.arange(k + 1, device=device)
        target_probs = logits if sampling.all_greedy else processed_probs(logits, sampling)
        if draft_probs is not None:
            draft_probs = draft_probs.to(device)
        return verify_drafts(drafts, draft_probs, target_probs, logits, sampling, positions)

    @staticmethod
    def read_back(verdict: Verdict, started: torch.cuda.Event | None = None) -> Readback:
        """Queue the verdict's copy to the host (accepted counts and rows in one tensor) right behind it;
        `started`: where the verify began on the stream, for the readback's device time."""
        return Readback(torch.cat((verdict.accepted.unsqueeze(1), verdict.tokens), dim=1), started)

    def commit(self, seq_ids: list[int], readback: Readback) -> tuple[list[list[int]], list[int]]:
        """Wait for the verdict, append each row's tokens and drop the KV of rejected drafts.
        Returns the rows (k+1 wide, -1 padded) and the accepted counts."""
        packed = readback.tolist()
        rows = [p[1:] for p in packed]
        accepted = [p[0] for p in packed]
        for seq_id, row, n in zip(seq_ids, rows, accepted, strict=True):
            st = self.seqs[seq_id]
            st.cached = st.length + n
            st.tokens.extend(row[: n + 1])
            self.runner.truncate(seq_id, st.cached)
        return rows, accepted

    def _score(self, states: list, drafts: torch.Tensor) -> torch.Tensor:
        """Target logits [B, k+1, V] for the last committed token and the k drafts of each row."""
        k = drafts.shape[1]
        seq_ids = [st.seq_id for st in states]
        starts = [st.cached for st in states]
        if all(st.length - st.cached == 1 for st in states):  # steady state: stay on the device
            last = self.runner.to_device(torch.tensor([st.tokens[-1] for st in states], dtype=torch.long))
            ids = torch.cat((last.unsqueeze(1), drafts), dim=1)
            return self.runner.forward_ids(seq_ids, ids, starts, [k + 1] * len(states), last_n=k + 1)
        feed = [st.uncached() + d for st, d in zip(states, drafts.tolist(), strict=True)]
        return self.runner.forward(seq_ids, feed, starts, last_n=k + 1)
