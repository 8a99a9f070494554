"""TokenLogprob entries (core/logprobs.py) in the three shapes clients read them in.

Completions: {tokens, token_logprobs, top_logprobs, text_offset}, each top dict the top N plus the sampled
token (vLLM's rule). Chat: content[i] = {token, logprob, bytes, top_logprobs: exactly N}. vLLM's
prompt_logprobs: [None, {"<id>": {logprob, rank, decoded_token}}, ...]. Every token is decoded on its own with
special tokens shown (or named "token_id:<id>" with return_tokens_as_token_ids). Values are passed on as the
engine gave them, never rounded, so the chosen token's logprob equals the top value for a greedy token;
only -inf (a masked token) becomes -9999.0, which JSON can carry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from minedraft.batch_manager.openai_responses import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from minedraft.core.logprobs import TokenLogprob
from minedraft.core.tokenizer import Tokenizer

MASKED_LOGPROB = -9999.0  # what vLLM sends for -inf


def json_logprob(value: float) -> float:
    return value if math.isfinite(value) else MASKED_LOGPROB


@dataclass(slots=True)
class TokenNames:
    """Each token's text decoded on its own, cached (a response names the same tokens many times)."""

    tokenizer: Tokenizer
    as_token_ids: bool = False
    _cache: dict[int, str] = field(default_factory=dict)

    def __call__(self, token_id: int) -> str:
        if self.as_token_ids:
            return f"token_id:{token_id}"
        name = self._cache.get(token_id)
        if name is None:
            name = self._cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return name


def entries_of(token_ids: Sequence[int], entries: Sequence[TokenLogprob] | None) -> list[TokenLogprob] | None:
    """The entries when there is one per token (a backend that did not compute them gives None or fewer)."""
    if entries is None or len(entries) != len(token_ids):
        return None
    return list(entries)


@dataclass(slots=True)
class CompletionLogprobsBuilder:
    """One choice's completions logprobs, built chunk by chunk; `offset` is where the next token's text starts."""

    names: TokenNames
    top_n: int
    offset: int = 0

    def prompt_part(self, prompt_ids: Sequence[int], entries: Sequence[TokenLogprob | None]) -> CompletionLogprobs:
        """Echo: the prompt's tokens first, the first one (nothing predicts it) with null values."""
        out = CompletionLogprobs()
        for token_id, entry in zip(prompt_ids, entries, strict=False):
            self._add(out, token_id, entry)
        return out

    def part(self, entries: Sequence[TokenLogprob]) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for entry in entries:
            self._add(out, entry.token_id, entry)
        return out

    def _add(self, out: CompletionLogprobs, token_id: int, entry: TokenLogprob | None) -> None:
        name = self.names(token_id)
        out.tokens.append(name)
        out.text_offset.append(self.offset)
        self.offset += len(name)
        if entry is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            return
        top = {self.names(tid): json_logprob(lp) for tid, lp in entry.top[: self.top_n]}
        top.setdefault(name, json_logprob(entry.logprob))
        out.token_logprobs.append(json_logprob(entry.logprob))
        out.top_logprobs.append(top)


def join_completion_logprobs(parts: Sequence[CompletionLogprobs]) -> CompletionLogprobs:
    out = CompletionLogprobs()
    for part in parts:
        out.tokens += part.tokens
        out.token_logprobs += part.token_logprobs
        out.top_logprobs += part.top_logprobs
        out.text_offset += part.text_offset
    return out


def _top(names: TokenNames, token_id: int, logprob: float) -> TopLogprob:
    name = names(token_id)
    return TopLogprob(token=name, logprob=json_logprob(logprob), bytes=list(name.encode("utf-8")))


def chat_logprobs(names: TokenNames, entries: Sequence[TokenLogprob], top_n: int) -> ChatLogprobs:
    content = []
    for entry in entries:
        chosen = _top(names, entry.token_id, entry.logprob)
        alternatives = [_top(names, tid, lp) for tid, lp in entry.top[:top_n]]
        content.append(ChatTokenLogprob(**chosen.model_dump(), top_logprobs=alternatives))
    return ChatLogprobs(content=content)


def vllm_prompt_logprobs(names: TokenNames, prompt_ids: Sequence[int], entries: Sequence[TokenLogprob | None],
                         top_n: int) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's shape: per prompt token, its own entry and the top N, keyed by token id."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for token_id, entry in zip(prompt_ids, entries, strict=False):
        if entry is None:
            out.append(None)
            continue
        ranked = {str(tid): {"logprob": json_logprob(lp), "rank": rank, "decoded_token": names(tid)}
                  for rank, (tid, lp) in enumerate(entry.top[:top_n], start=1)}
        ranked.setdefault(str(token_id), {"logprob": json_logprob(entry.logprob), "rank": entry.rank,
                                          "decoded_token": names(token_id)})
        out.append(ranked)
    return out
