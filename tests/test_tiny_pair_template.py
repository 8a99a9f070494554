"""The bundled pair's tokenizer configs carry the chat template the tiny-pair builder writes, so rebuilding the
pair (`python -m minedraft.bench.tiny_pair`) keeps tools, tool results and thinking in `minedraft serve`."""

from __future__ import annotations

import json

from minedraft.bench.tiny_pair.bpe_tokenizer import tokenizer_config
from minedraft.bundled import TINY_DRAFT, TINY_TARGET


def test_the_bundled_configs_are_what_the_builder_writes() -> None:
    for folder in (TINY_TARGET, TINY_DRAFT):
        assert json.loads((folder / "tokenizer_config.json").read_text()) == tokenizer_config()
    assert "tool_call" in tokenizer_config()["chat_template"]
