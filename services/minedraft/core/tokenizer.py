"""Tokenizer from a model folder's tokenizer.json (the `tokenizers` library)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from minedraft.core.errors import ModelLoadError


class Tokenizer:
    """Encode/decode plus the special-token facts the server needs."""

    def __init__(self, folder: str | Path) -> None:
        path = Path(folder)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise ModelLoadError(f"{folder}: no tokenizer.json found")
        try:
            self._tok = HFTokenizer.from_file(str(file))
        except Exception as exc:  # the Rust side raises a generic Exception
            raise ModelLoadError(f"{file}: cannot parse tokenizer ({exc})") from exc
        cfg_file = path / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        self.eos_token_id = self._special_id(self.config.get("eos_token"))
        self.chat_template: str | None = self.config.get("chat_template")

    def _special_id(self, token: Any) -> int | None:
        if isinstance(token, dict):
            token = token.get("content")
        if not isinstance(token, str):
            return None
        return self._tok.token_to_id(token)

    @property
    def backend(self) -> HFTokenizer:
        """The `tokenizers` object, for incremental decoding (core/detokenizer.py)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_unlocked(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids `encode` gives, computed with the GIL released (the library's batch path does
        that, its single-text path does not), so a worker thread can tokenize a long text while
        the event loop keeps serving."""
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def stop_ids(self, model_eos_ids: Iterable[int]) -> frozenset[int]:
        """Ids that end a request: the model's own end-of-sequence ids (config.json, often
        several, e.g. Llama 3.1's eot / eom / end_of_text) plus the tokenizer's eos token."""
        extra = [self.eos_token_id] if self.eos_token_id is not None else []
        return frozenset([*model_eos_ids, *extra])
