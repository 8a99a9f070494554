"""Target side of speculative decoding: score k+1 positions in one forward and judge."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from minedraft.core.logprobs import TokenLogprob
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.drafter import Proposal
from minedraft.engine.grammar import mask_logits
from minedraft.engine.logits_processing import LogitsProcessing, processes
from minedraft.engine.logprobs import log_softmax, pack, unpack
from minedraft.engine.ragged import verify_logits
from minedraft.engine.readback import Readback
from minedraft.engine.rejection import Verdict, verify_drafts
from minedraft.engine.runner import ModelRunner
from minedraft.engine.sampling import BatchSampling, processed_probs
from minedraft.engine.sequence import SeqState
from minedraft.engine.sequence_host import SequenceHost


@dataclass(slots=True)
class LogprobsInFlight:
    """A judged step's logprobs on the device: emitted-token rows and prompt rows, read back at commit."""

    rows: list[int]  # indices into the step's batch of the sequences that asked for logprobs
    width: int  # top alternatives packed per position
    packed: torch.Tensor | None  # [len(rows), k+1, 2 + 2 width]
    prompt: list[tuple[int, int, torch.Tensor]] = field(default_factory=list)  # (seq id, top_n, packed [P-1, ...])


@dataclass(slots=True)
class VerdictReadback:
    """The verdict's tokens and, when some sequence asked, its logprobs, both copied behind the step."""

    tokens: Readback
    logprobs: LogprobsInFlight | None = None
    logprob_host: Readback | None = None
    prompt_host: list[tuple[int, int, Readback]] = field(default_factory=list)

    def ready(self) -> bool:
        return self.tokens.ready()

    def tolist(self) -> list:
        return self.tokens.tolist()

    def device_ms(self) -> float:
        return self.tokens.device_ms()


class Verifier(SequenceHost):
    """Owns the target model's KV, the sequences' logits processing and the rejection sampler.

    With k = 0 drafts the same step is plain autoregressive decoding (and prefill). After `commit`,
    `last_logprobs` and `last_prompt_logprobs` hold the committed step's entries by sequence id.
    """

    def __init__(self, runner: ModelRunner) -> None:
        super().__init__(runner)
        self.processing = LogitsProcessing(runner.config.vocab_size, runner.device)
        self.prompt_logprobs_done: set[int] = set()
        self.featured: set[int] = set()  # sequences asking for processing or logprobs: a step without any skips both
        self.last_logprobs: dict[int, list[TokenLogprob]] = {}
        self.last_prompt_logprobs: dict[int, list[TokenLogprob]] = {}
        self._pending_logprobs: LogprobsInFlight | None = None  # the last judge's, until its read_back

    def add(self, seq_id: int, tokens: list[int], params: SamplingParams, prompt_len: int | None = None,
            **cache: Any) -> None:
        super().add(seq_id, tokens, params, prompt_len, **cache)
        self.processing.forget(seq_id)
        if (processes(params) or params.logprobs is not None or params.prompt_logprobs is not None
                or params.structured is not None):
            self.featured.add(seq_id)

    def remove(self, seq_id: int) -> None:
        super().remove(seq_id)
        self.processing.forget(seq_id)
        self.prompt_logprobs_done.discard(seq_id)
        self.featured.discard(seq_id)

    def verify(self, seq_ids: list[int], proposal: Proposal | None) -> Verdict:
        verdict = self.judge(seq_ids, proposal)
        self.commit(seq_ids, self.read_back(verdict))
        return verdict

    def judge(self, seq_ids: list[int], proposal: Proposal | None) -> Verdict:
        """Queue the scoring forward and the acceptance rule on the device; no host synchronisation
        in the steady state, so a caller can hand the verdict on (a data-plane send) while the GPU
        still runs, then `commit` (with `read_back(verdict)`, which carries the step's logprobs)."""
        verdict, self._pending_logprobs = self.judge_with_logprobs(seq_ids, proposal)
        return verdict

    def judge_with_logprobs(self, seq_ids: list[int], proposal: Proposal | None
                            ) -> tuple[Verdict, LogprobsInFlight | None]:
        states = [self.seqs[s] for s in seq_ids]
        device = self.runner.device
        ragged: list[int] | torch.Tensor | None = None  # TETRIS: per-row draft counts, on the host or the device
        if proposal is not None:
            ragged = proposal.lengths if proposal.lengths is not None else proposal.counts
        if proposal is None:
            drafts = torch.zeros((len(seq_ids), 0), dtype=torch.long, device=device)
            draft_probs = None
        else:
            drafts, draft_probs = proposal.tokens.to(device), proposal.probs
        k = drafts.shape[1]
        featured = bool(self.featured) and not self.featured.isdisjoint(seq_ids)
        prompt_rows = [b for b, st in enumerate(states) if self._wants_prompt_logprobs(st)] if featured else []
        if prompt_rows and isinstance(ragged, torch.Tensor):  # their windows are laid out on the host
            ragged = ragged.tolist()
        grammar_rows = self.grammars.rows(seq_ids) if featured else []
        drafts_host = drafts.tolist() if grammar_rows else []  # before the forward is queued: masks overlap it
        if ragged is None:
            logits, full = self._score(states, drafts, bool(prompt_rows))
        else:  # rows verify their own counts; slots past a row's count are never read (-1 drafts there)
            capacity = proposal.capacity if proposal is not None and proposal.counts is not None else None
            logits, full = verify_logits(self.runner, states, drafts, ragged, bool(prompt_rows), capacity)
            drafts = drafts.clamp(min=0)
        processed = self.processing.apply(logits, states, drafts) if featured else logits
        if grammar_rows:
            processed = mask_logits(processed, grammar_rows, self.grammars.verify_masks(seq_ids, grammar_rows,
                                                                                        drafts_host))
        sampling = self.sampling(seq_ids)
        positions = None  # the slots' sequence positions key the random draws: greedy rows draw nothing
        if not sampling.all_greedy:
            lengths = self.runner.to_device(torch.tensor([st.length for st in states], dtype=torch.long))
            positions = lengths.unsqueeze(1) + torch.arange(k + 1, device=device)
        target_probs = processed if sampling.all_greedy else processed_probs(processed, sampling)
        if draft_probs is not None:
            draft_probs = draft_probs.to(device)
        judged = (drafts, draft_probs, target_probs, processed, sampling, positions)
        verdict = (verify_drafts(*judged) if ragged is None else
                   verify_drafts(*judged, lengths=ragged if isinstance(ragged, torch.Tensor) else
                                 self.runner.to_device(torch.tensor(ragged, dtype=torch.long))))
        logprobs = self._logprobs(states, logits, processed, verdict) if featured else None
        if prompt_rows:
            assert full is not None
            logprobs = logprobs or LogprobsInFlight([], 0, None)
            logprobs.prompt = [self._prompt_logprobs(states[b], full[b], len(states[b].uncached())
                                                     + (k if ragged is None else ragged[b])) for b in prompt_rows]
        return verdict, logprobs

    def stage_logprobs(self, seq_ids: list[int], raw: torch.Tensor, processed: torch.Tensor, verdict: Verdict
                       ) -> None:
        """For a step decoded outside `judge` (verifier/ar_ahead.py): its rows' logprobs, as `judge` computes
        them from the step's raw and processed logits, for `read_back` to bring back with the verdict."""
        states = [self.seqs[s] for s in seq_ids]
        self._pending_logprobs = self._logprobs(states, raw, processed, verdict)

    def _wants_prompt_logprobs(self, st: SeqState) -> bool:
        return st.params.prompt_logprobs is not None and st.seq_id not in self.prompt_logprobs_done and st.cached == 0

    def _logprobs(self, states: list[SeqState], raw: torch.Tensor, processed: torch.Tensor, verdict: Verdict
                  ) -> LogprobsInFlight | None:
        rows = [b for b, st in enumerate(states) if st.params.logprobs is not None]
        if not rows:
            return None
        width = max(states[b].params.logprobs or 0 for b in rows)
        index = self.runner.to_device(torch.tensor(rows, dtype=torch.long))
        if all(states[b].params.logprobs_mode == "raw_logprobs" for b in rows):
            source = log_softmax(raw[index])
        else:  # per row: raw, or the distribution sampled from (after processing and temperature)
            row_sampling = BatchSampling.from_params([states[b].params for b in rows], self.runner.device)
            processed_lp = torch.log(processed_probs(processed[index], row_sampling))
            is_raw = torch.tensor([states[b].params.logprobs_mode == "raw_logprobs" for b in rows])
            source = torch.where(self.runner.to_device(is_raw).view(-1, 1, 1), log_softmax(raw[index]), processed_lp)
        return LogprobsInFlight(rows, width, pack(source, verdict.tokens[index], width))

    def _prompt_logprobs(self, st: SeqState, full: torch.Tensor, fed: int) -> tuple[int, int, torch.Tensor]:
        """Raw logprobs of prompt tokens 1..P-1 from the logits at positions 0..P-2 (this row fed `fed` tokens
        from position 0, right-aligned in `full` [W, V])."""
        self.prompt_logprobs_done.add(st.seq_id)
        top_n = st.params.prompt_logprobs or 0
        count = st.prompt_len - 1
        start = full.shape[0] - fed
        targets = self.runner.to_device(torch.tensor(st.tokens[1:st.prompt_len], dtype=torch.long))
        source = log_softmax(full[start:start + count])
        return st.seq_id, top_n, pack(source.unsqueeze(0), targets.unsqueeze(0), top_n)[0]

    def read_back(self, verdict: Verdict, started: torch.cuda.Event | None = None) -> VerdictReadback:
        """Queue the verdict's copy to the host (accepted counts and rows in one tensor, the logprobs of the
        `judge` that made it in others) right behind it; `started`: where the verify began on the stream, for
        the readback's device time."""
        logprobs, self._pending_logprobs = self._pending_logprobs, None
        packed = verdict.packed
        if packed is None:
            packed = torch.cat((verdict.accepted.unsqueeze(1), verdict.tokens), dim=1)
        out = VerdictReadback(Readback(packed, started), logprobs)
        if logprobs is not None:
            if logprobs.packed is not None:
                out.logprob_host = Readback(logprobs.packed)
            out.prompt_host = [(seq_id, n, Readback(packed)) for seq_id, n, packed in logprobs.prompt]
        return out

    def commit(self, seq_ids: list[int], readback: VerdictReadback, hold: int = 0
               ) -> tuple[list[list[int]], list[int]]:
        """Wait for the verdict, append each row's tokens and drop the KV blocks of rejected drafts, keeping the
        blocks of `hold` positions past the committed ones (a step launched ahead writes them: verifier/ar_ahead.py)
        and at least those the next step of the same width writes: releasing a block that the next verify
        allocates again would churn the allocator and rewrite the block-table rows every few steps (the stale KV
        in a kept block is overwritten before any query reads it). Returns the rows (k+1 wide, -1 padded) and the
        accepted counts."""
        packed = readback.tolist()
        rows = [p[1:] for p in packed]
        accepted = [p[0] for p in packed]
        self._commit_logprobs(seq_ids, rows, accepted, readback)
        for seq_id, row, n in zip(seq_ids, rows, accepted, strict=True):
            st = self.seqs[seq_id]
            st.cached = st.length + n
            st.tokens.extend(row[: n + 1])
            self.runner.truncate(seq_id, st.cached + max(hold, len(row)))
            self.prefix.publish(st)
            self.grammars.commit(seq_id, row[: n + 1])
        return rows, accepted

    def _commit_logprobs(self, seq_ids: list[int], rows: list[list[int]], accepted: list[int],
                         readback: VerdictReadback) -> None:
        self.last_logprobs, self.last_prompt_logprobs = {}, {}
        flight = readback.logprobs
        if flight is None:
            return
        if readback.logprob_host is not None:
            for b, values in zip(flight.rows, readback.logprob_host.tolist(), strict=True):
                st = self.seqs[seq_ids[b]]
                self.last_logprobs[seq_ids[b]] = unpack(values, accepted[b] + 1, st.params.logprobs or 0,
                                                        flight.width, rows[b])
        for seq_id, top_n, host in readback.prompt_host:
            st = self.seqs[seq_id]
            self.last_prompt_logprobs[seq_id] = unpack(host.tolist(), st.prompt_len - 1, top_n, top_n,
                                                       st.tokens[1:st.prompt_len])

    def _score(self, states: list[SeqState], drafts: torch.Tensor, whole: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Target logits [B, k+1, V] for the last committed token and the k drafts of each row; with `whole`,
        also the logits of every fed position ([B, W, V], rows right-aligned), for prompt logprobs."""
        k = drafts.shape[1]
        seq_ids = [st.seq_id for st in states]
        starts = [st.cached for st in states]
        if not whole and all(st.length - st.cached == 1 for st in states):  # steady state: stay on the device
            last = self.runner.to_device(torch.tensor([st.tokens[-1] for st in states], dtype=torch.long))
            ids = torch.cat((last.unsqueeze(1), drafts), dim=1)
            return self.runner.forward_ids(seq_ids, ids, starts, [k + 1] * len(states), last_n=k + 1), None
        feed = [st.uncached() + d for st, d in zip(states, drafts.tolist(), strict=True)]
        if not whole:
            return self.runner.forward(seq_ids, feed, starts, last_n=k + 1), None
        full = self.runner.forward(seq_ids, feed, starts, last_n=max(len(f) for f in feed))
        return full[:, full.shape[1] - (k + 1):], full
