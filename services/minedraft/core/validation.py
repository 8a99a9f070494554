"""Checks a request must pass before it takes KV memory."""

from __future__ import annotations

from minedraft.core.errors import InvalidRequestError
from minedraft.core.sampling_params import SamplingParams


def validate_request(prompt_ids: list[int], params: SamplingParams, max_context: int, vocab_size: int) -> None:
    """Raise InvalidRequestError with a message that says what to change."""
    if not prompt_ids:
        raise InvalidRequestError("prompt is empty: give at least one token of text", param="prompt")
    if len(prompt_ids) >= max_context:  # before any per-token work: a huge prompt costs nothing more
        raise InvalidRequestError(f"prompt ({len(prompt_ids)} tokens) leaves no room in the model's context of "
                                  f"{max_context} tokens; shorten it", param="prompt")
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})",
                                  param="prompt")
    params.validate(vocab_size)
    total = len(prompt_ids) + params.max_tokens
    if total > max_context:
        raise InvalidRequestError(
            f"prompt ({len(prompt_ids)} tokens) plus max_tokens ({params.max_tokens}) is {total}, "
            f"over the model's context of {max_context} tokens; shorten the prompt or lower max_tokens",
            param="max_tokens" if len(prompt_ids) < max_context else "prompt",
        )


def validate_k(k: int) -> None:
    if not isinstance(k, int) or k < 1:
        raise InvalidRequestError(f"k (draft tokens per step) must be an integer >= 1, got {k!r}")
