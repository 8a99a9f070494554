"""Grammar masks (structured outputs) at every position a step samples, on the target and on the draft.

Each sequence with a grammar keeps an llguidance matcher that has consumed its committed output. A verify
row's slot i is masked with the matcher's state after the drafts before it (committed output + drafts[:i]),
the history that slot would have had in plain decoding, so the rejection rule stays exact (as for logits
processing): a draft the grammar forbids has probability 0 at its slot and is rejected there, and the slots
after it are never reached. Drafts are consumed only as far as the grammar allows them (`validate_tokens`)
and rolled back after the masks are built; the verdict's tokens are consumed at commit. The draft model masks
its own proposals the same way, one position at a time, and rolls them back when the verdict comes. Masks are
built on the host while the step's forward runs; `mask_ms` totals that time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from minedraft.engine.transfer import to_device

log = logging.getLogger(__name__)


class GrammarMasks:
    """The matchers of one worker's sequences, and the masks they give."""

    def __init__(self, vocab_size: int, device: torch.device, eos_ids: Sequence[int] = ()) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.eos_ids = list(eos_ids)
        self._ends = frozenset(eos_ids)  # never consumed: the sequence ends there (and a rollback across one
        # does not restore the matcher)
        self.tokenizer_dir: Path | None = None
        self._tokenizer = None  # llguidance.LLTokenizer, built on the first grammar (about a second)
        self._templates: dict[str, object] = {}  # grammar text -> a fresh matcher, deep-copied per sequence
        self.matchers: dict[int, object] = {}
        self._drafted: dict[int, int] = {}  # draft tokens consumed by a proposal in progress, by sequence
        self.mask_ms = 0.0

    def _template(self, grammar: str):
        from llguidance import LLMatcher, LLTokenizer

        if self._tokenizer is None:
            if self.tokenizer_dir is None or not (self.tokenizer_dir / "tokenizer.json").is_file():
                raise RuntimeError("structured outputs need the model's tokenizer.json beside its weights")
            text = (self.tokenizer_dir / "tokenizer.json").read_text()
            self._tokenizer = LLTokenizer(text, n_vocab=self.vocab_size, eos_token=self.eos_ids or None)
        template = self._templates.get(grammar)
        if template is None:
            template = LLMatcher(self._tokenizer, grammar, log_level=0)
            if template.is_error():
                raise ValueError(f"grammar does not compile: {template.get_error()}")
            self._templates[grammar] = template
        return template

    def add(self, seq_id: int, grammar: str, output: list[int]) -> None:
        """A sequence joins with its output so far (a resumed one) already consumed."""
        matcher = self._template(grammar).deep_copy()
        if output and not matcher.consume_tokens(output):
            log.error("sequence %d: its output does not match its grammar (%s)", seq_id, matcher.get_error())
        self.matchers[seq_id] = matcher

    def forget(self, seq_id: int) -> None:
        self.matchers.pop(seq_id, None)
        self._drafted.pop(seq_id, None)

    def rows(self, seq_ids: Sequence[int]) -> list[int]:
        return [b for b, s in enumerate(seq_ids) if s in self.matchers] if self.matchers else []

    def commit(self, seq_id: int, tokens: list[int]) -> None:
        matcher = self.matchers.get(seq_id)
        if matcher is None:
            return
        for token in tokens:
            if matcher.is_stopped() or token in self._ends:  # the grammar is complete, or the sequence ends
                return
            if not matcher.consume_token(token):
                log.error("sequence %d: committed token %d outside its grammar (%s)", seq_id, token,
                          matcher.get_error()[:200])
                return

    def _allowed(self, matcher) -> np.ndarray:
        if matcher.is_error():
            return np.ones(self.vocab_size, dtype=bool)  # never empty: a broken matcher constrains nothing
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = bits[: self.vocab_size].astype(bool)
        if allowed.shape[0] < self.vocab_size:  # ids past the tokenizer's vocabulary are never text
            allowed = np.pad(allowed, (0, self.vocab_size - allowed.shape[0]))
        return allowed

    def verify_masks(self, seq_ids: Sequence[int], rows: list[int], drafts: list[list[int]]) -> torch.Tensor:
        """Allowed tokens [len(rows), k+1, V] at each slot of the verify rows `rows` (drafts: every row's)."""
        started = time.perf_counter()
        slots = (len(drafts[0]) if drafts else 0) + 1
        out = np.ones((len(rows), slots, self.vocab_size), dtype=bool)
        for r, b in enumerate(rows):
            matcher = self.matchers[seq_ids[b]]
            row = drafts[b]
            cut = row.index(-1) if -1 in row else len(row)  # TETRIS pruned the rest of the row (-1): never verified
            valid = matcher.validate_tokens(row[:cut]) if slots > 1 else 0
            consumed = 0
            for i in range(min(valid + 1, slots)):
                out[r, i] = self._allowed(matcher)
                if i == valid or drafts[b][i] in self._ends:
                    break  # later slots are never reached: this draft is rejected, or it ends the sequence
                matcher.consume_token(drafts[b][i])
                consumed += 1
            if consumed:
                matcher.rollback(consumed)
        self.mask_ms += (time.perf_counter() - started) * 1000.0
        return to_device(torch.from_numpy(out), self.device)

    def draft_mask(self, seq_ids: Sequence[int], rows: list[int]) -> torch.Tensor:
        """Allowed tokens [len(rows), V] at the next position of each of the rows `rows`."""
        started = time.perf_counter()
        out = np.stack([self._allowed(self.matchers[seq_ids[b]]) for b in rows])
        self.mask_ms += (time.perf_counter() - started) * 1000.0
        return to_device(torch.from_numpy(out), self.device)

    def consume_drafts(self, seq_ids: Sequence[int], rows: list[int], tokens: list[int]) -> None:
        """The draft tokens just proposed for the rows `rows` (undone by `rollback_drafts`)."""
        for b, token in zip(rows, tokens, strict=True):
            seq_id = seq_ids[b]
            matcher = self.matchers[seq_id]
            if token not in self._ends and not matcher.is_stopped() and matcher.consume_token(token):
                self._drafted[seq_id] = self._drafted.get(seq_id, 0) + 1

    def rollback_drafts(self, seq_ids: Sequence[int], rows: list[int]) -> None:
        for b in rows:
            count = self._drafted.pop(seq_ids[b], 0)
            if count:
                self.matchers[seq_ids[b]].rollback(count)


def mask_logits(logits: torch.Tensor, rows: list[int], allowed: torch.Tensor) -> torch.Tensor:
    """logits [B, ..., V] with the rows `rows` limited to `allowed` [len(rows), ..., V] (a new tensor)."""
    index = to_device(torch.tensor(rows, dtype=torch.long), logits.device)
    out = logits.float().clone()
    out[index] = out[index].masked_fill(~allowed, float("-inf"))
    return out
