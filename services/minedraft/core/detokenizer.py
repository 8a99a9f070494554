"""Incremental detokenisation: each new token costs O(1) decode work, not a re-decode of the
whole output (which made every step O(n) per request, O(n^2) per request overall, on the
batch manager's event loop).

`tokenizers`' DecodeStream does the hard part (byte-fallback and multi-byte characters split
across tokens: it holds tokens back until they form valid UTF-8). What it cannot do is flush:
tokens still held back when the request ends would never appear, while a full decode shows
them as U+FFFD. `finish` decodes that held-back tail once, so the streamed text always equals
`tokenizer.decode(all output ids)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenizers.decoders import DecodeStream

if TYPE_CHECKING:
    from minedraft.core.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Text of one request's output, extended token by token."""

    __slots__ = ("_held", "_skip_special", "_stream", "_tokenizer")

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._held: list[int] = []  # ids the stream has not turned into text yet

    def step(self, token_id: int) -> str:
        """Text that `token_id` completes (often empty while a character is split)."""
        piece = self._stream.step(self._tokenizer.backend, token_id)
        if piece is None:
            self._held.append(token_id)
            return ""
        self._held.clear()
        return piece

    def finish(self, all_ids: list[int], text_so_far: str) -> str:
        """The last piece of text at the end of a request: what a full decode shows beyond `text_so_far`."""
        if not self._held:
            return ""
        full = self._tokenizer.decode(all_ids, skip_special_tokens=self._skip_special)
        self._held.clear()
        return full[len(text_so_far):] if full.startswith(text_so_far) else ""
