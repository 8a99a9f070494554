"""A request's life cycle: output tokens, stop conditions, text and statistics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minedraft.core.detokenizer import IncrementalDetokenizer
from minedraft.core.logprobs import TokenLogprob
from minedraft.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from minedraft.core.tokenizer import Tokenizer

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"


@dataclass(slots=True)
class RequestStats:
    """Per-request speculation counters and timings.

    Times are `time.perf_counter()` readings (durations); `started_ns` anchors them to the wall
    clock for traces, whose timestamps must be epoch nanoseconds.
    """

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    started: float = field(default_factory=time.perf_counter)
    started_ns: int = field(default_factory=time.time_ns)
    admitted: float | None = None  # left the queue for a batch
    first_token: float | None = None  # first output tokens verified
    last_token: float | None = None
    finished: float | None = None
    first_step: int = -1  # the loop's step ids that verified this request's first and last tokens
    last_step: int = -1

    def note_tokens(self, now: float, step: int) -> float | None:
        """Tokens verified in `step` arrived at `now`: the time since the previous ones, or None for the first."""
        previous = self.last_token
        if self.first_token is None:
            self.first_token = now
            self.first_step = step
        self.last_token = now
        self.last_step = step
        return None if previous is None else now - previous

    def wall_ns(self, reading: float | None) -> int | None:
        """A perf_counter reading of this request as epoch nanoseconds."""
        return None if reading is None else self.started_ns + int((reading - self.started) * 1e9)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def as_dict(self, output_tokens: int) -> dict[str, float]:
        end = self.finished or time.perf_counter()
        elapsed = max(end - self.started, 1e-9)
        return {
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(output_tokens / self.steps, 4) if self.steps else 0.0,
            "tokens_per_s": round(output_tokens / elapsed, 2),
            "steps": self.steps,
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
        }


@dataclass(slots=True)
class Request:
    """One generation request as the engine and the batch manager track it."""

    req_id: int
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output token, when asked for
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token, the first None
    cumulative_logprob: float = 0.0  # of the kept output tokens (best_of ranks by it)
    _sent_text: int = 0
    _sent_tokens: int = 0
    _sent_prompt_logprobs: bool = False
    _detok: IncrementalDetokenizer | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def all_tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def unsent_tokens(self) -> int:
        """Output tokens not yet handed to the client (`take_delta` hands them on)."""
        return len(self.output_ids) - self._sent_tokens

    @property
    def num_tokens(self) -> int:
        """len(all_tokens) without building the list (the batch manager asks for every sequence each step)."""
        return len(self.prompt_ids) + len(self.output_ids)

    def finish(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
            self.stats.finished = time.perf_counter()

    def abort(self) -> None:
        """End the request now; text held back for an unfinished UTF-8 character becomes final (and, as for any
        finished request, `take_delta` releases what was held back for a possible stop string)."""
        if self.finished:
            return
        self.finish(FINISH_ABORT)
        if self._detok is not None:
            self.text += self._detok.finish(self.output_ids, self.text)

    def append_tokens(self, new_tokens: list[int], eos_ids: frozenset[int], tokenizer: Tokenizer,
                      logprobs: list[TokenLogprob] | None = None) -> int:
        """Append verified tokens up to the first stop condition, one at a time (an end token may sit inside
        an accepted run); returns how many were kept. `logprobs`: one entry per token in `new_tokens`.
        No stop condition but the length counts before `min_tokens` tokens (vLLM's rule)."""
        if self.finished:
            return 0
        if self._detok is None:
            self._detok = IncrementalDetokenizer(tokenizer, self.params.skip_special_tokens)
        previous = len(self.text)
        pieces = []
        kept = 0
        p = self.params
        for i, token in enumerate(new_tokens):
            self.output_ids.append(token)
            if logprobs is not None:
                self.logprobs.append(logprobs[i])
                self.cumulative_logprob += logprobs[i].logprob
            pieces.append(self._detok.step(token))
            kept += 1
            if len(self.output_ids) >= p.min_tokens and ((not p.ignore_eos and token in eos_ids)
                                                         or token in p.stop_token_ids):
                self.finish(FINISH_STOP)
            elif len(self.output_ids) >= p.max_tokens:
                self.finish(FINISH_LENGTH)
            if self.finished:
                break
        self.text += "".join(pieces)
        if self.finished:
            self.text += self._detok.finish(self.output_ids, self.text)
        if len(self.output_ids) >= p.min_tokens:
            self._apply_stop_strings(previous)
        return kept

    def _apply_stop_strings(self, previous: int) -> None:
        """Cut the text at the first stop string (after it with `include_stop_str_in_output`); only text new
        since `previous` can complete one."""
        if not self.params.stop:
            return
        longest = max(len(s) for s in self.params.stop)
        search_from = max(0, previous - longest + 1)
        hits = [(i, i + len(s)) for s in self.params.stop if (i := self.text.find(s, search_from)) >= 0]
        if hits:
            start, end = min(hits)
            self.text = self.text[: end if self.params.include_stop_str_in_output else start]
            self.finish(FINISH_STOP)

    def take_prompt_logprobs(self) -> list[TokenLogprob | None] | None:
        """The prompt's entries the first time they are there (they go out once, with the first chunk)."""
        if self._sent_prompt_logprobs or self.prompt_logprobs is None:
            return None
        self._sent_prompt_logprobs = True
        return self.prompt_logprobs

    def take_delta(self) -> tuple[str, list[int], list[TokenLogprob] | None]:
        """Text, token ids and their logprobs (None when not asked for) not yet handed to the client.

        While running, the last len(longest stop string) - 1 characters are held back: they
        could be the start of a stop string, and text once sent cannot be taken back.
        """
        text_end = len(self.text)
        if not self.finished:
            text_end = len(self.text.rstrip("\ufffd"))
            if self.params.stop:
                text_end -= max(len(s) for s in self.params.stop) - 1
        text_end = max(text_end, self._sent_text)
        delta_text = self.text[self._sent_text : text_end]
        delta_tokens = self.output_ids[self._sent_tokens :]
        delta_logprobs = self.logprobs[self._sent_tokens :] if self.params.wants_logprobs else None
        self._sent_text = text_end
        self._sent_tokens = len(self.output_ids)
        return delta_text, delta_tokens, delta_logprobs
