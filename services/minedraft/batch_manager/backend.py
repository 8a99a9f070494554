"""The contract between the public APIs (gRPC, HTTP) and whatever decodes.

Both the in-process engine backend and the batch-parallel coordinator implement
`GenerationBackend`; the API layers only see this.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from minedraft.core.errors import MinedraftError
from minedraft.core.logprobs import TokenLogprob
from minedraft.core.request import Request, RequestStats
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer


class RetryLaterError(MinedraftError):
    """Refused for now; `retry_after_s` is what the HTTP Retry-After header (and gRPC metadata) suggest."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFullError(RetryLaterError):
    """Too many requests are waiting; the client should retry later (429 / RESOURCE_EXHAUSTED)."""


class UnavailableError(RetryLaterError):
    """The backend cannot serve right now (starting, draining, or its verifier is gone; a request
    running on a verifier that died ends with it): 503 / UNAVAILABLE."""


class RequestTimeoutError(MinedraftError):
    """The request's own deadline (`timeout`) passed before anything was sent: 408 / DEADLINE_EXCEEDED."""


@dataclass(slots=True)
class GenerationChunk:
    """Output produced since the previous chunk of the same request."""

    text: str
    token_ids: list[int]
    finish_reason: str | None  # None while running; "stop" | "length" | "abort" at the end
    prompt_tokens: int
    completion_tokens: int  # total so far
    stats: RequestStats | None = None  # on the last chunk only: the request's timings, for its trace
    logprobs: list[TokenLogprob] | None = None  # one per token in token_ids, when the request asked
    prompt_logprobs: list[TokenLogprob | None] | None = None  # once, on the first chunk that has them
    cumulative_logprob: float = 0.0  # of all output so far (best_of ranks by it)

    @classmethod
    def take_from(cls, req: Request) -> GenerationChunk | None:
        """What `req` produced since the last call; None when there is nothing to say."""
        text, token_ids, logprobs = req.take_delta()
        prompt_logprobs = req.take_prompt_logprobs()
        if not (text or token_ids or req.finished or prompt_logprobs):
            return None
        return cls(text, token_ids, req.finish_reason, len(req.prompt_ids), len(req.output_ids),
                   req.stats if req.finished else None, logprobs, prompt_logprobs, req.cumulative_logprob)


class GenerationBackend(Protocol):
    model_name: str
    tokenizer: Tokenizer
    max_context: int

    def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str, deadline: float | None = None,
        partial: bool = True, share_prompt: str | None = None,
    ) -> AsyncIterator[GenerationChunk]:
        """Stream chunks until one carries a finish_reason; with `partial` False (a caller that answers
        only once the request is done: unary gRPC, non-streaming HTTP) that chunk alone, holding all
        the output, so no per-step chunk is built, queued and passed along for nothing.

        Validation errors raise InvalidRequestError and a full queue raises QueueFullError,
        both before the first chunk; UnavailableError may come at any point (shutting down, or
        the verifier lost mid-request). Closing the iterator early (client gone) cancels the
        request and frees its KV blocks. At `deadline` (event-loop time; None: none) the request
        is aborted and its last chunk (finish_reason "abort") carries all the text it produced,
        including what was held back for a possible stop string or an unfinished character.
        Requests given the same `share_prompt` key (the n choices of one API request) have the same prompt,
        whose KV a backend may compute once and share.
        """
        ...

    def status(self) -> dict[str, object]:
        """Mode, batch sizes and counters for /health and metrics."""
        ...
