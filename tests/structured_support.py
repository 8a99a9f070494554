"""The HTTP app over the in-process engine on the bundled tiny pair (speculative, so grammar masks meet
drafts) or over scripted text, with an openai client, and grammar checks on the pair's tokenizer: the setting
of the structured-output, tool and reasoning tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from minedraft.batch_manager.backend import GenerationChunk
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from tests.conftest import engine_from_folders
from tests.engine_backend import EngineBackend
from tests.http_surface_support import http_app

MODEL = "tiny-target"


@dataclass
class TinyServer:
    backend: Any
    url: str
    http: httpx.Client
    client: openai.OpenAI


@contextmanager
def serve_backend(backend: Any) -> Iterator[TinyServer]:
    """The HTTP app over `backend` on a free loopback port, with clients, until the block ends."""
    with http_app(backend) as url, httpx.Client(base_url=url, timeout=120) as http:
        yield TinyServer(backend, url, http, openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0))


@contextmanager
def serve_tiny(mode: str = "sd", k: int = 4, max_num_seqs: int = 8) -> Iterator[TinyServer]:
    """The app over the tiny pair's in-process engine in `mode`."""
    engine = engine_from_folders(TINY_TARGET, TINY_DRAFT if mode != "ar" else None, mode, k=k,
                                 max_num_seqs=max_num_seqs)
    with EngineBackend(engine, model_name=MODEL, max_queue=64) as backend, serve_backend(backend) as served:
        yield served


@dataclass
class ScriptedText:
    """A backend that answers every request with `text`, cut into `piece`-character chunks, ending "stop": what a
    model that can call tools or think would write, through the real API layers (the tiny pair's tokenizer)."""

    text: str = ""
    piece: int = 3
    model_name: str = MODEL
    max_context: int = 1024
    tokenizer: Tokenizer = field(default_factory=lambda: Tokenizer(TINY_TARGET))
    params: list[SamplingParams] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)

    def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str, deadline: float | None = None,
                 partial: bool = True, share_prompt: str | None = None) -> AsyncIterator[GenerationChunk]:
        params.validate()
        self.params.append(params)
        self.prompts.append(prompt_ids)
        return self._chunks(len(prompt_ids), partial)

    async def _chunks(self, prompt_tokens: int, partial: bool) -> AsyncIterator[GenerationChunk]:
        pieces = [self.text[i:i + self.piece] for i in range(0, len(self.text), self.piece)] if partial else [
            self.text]
        for n, piece in enumerate(pieces, start=1):
            yield GenerationChunk(piece, [1], "stop" if n == len(pieces) else None, prompt_tokens, n)

    def status(self) -> dict[str, object]:
        return {}

def matches(grammar: str, text: str) -> bool:
    """Whether `text` (as the tiny pair's tokenizer splits it) is a whole output of the llguidance `grammar`."""
    from llguidance import LLMatcher, LLTokenizer

    tokenizer = Tokenizer(TINY_TARGET)
    matcher = LLMatcher(LLTokenizer((TINY_TARGET / "tokenizer.json").read_text(), n_vocab=tokenizer.vocab_size),
                        grammar, log_level=0)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return not matcher.is_error() and matcher.consume_tokens(ids) and matcher.is_accepting()


def compact(text: str) -> bool:
    """No whitespace between JSON tokens (inside strings it is the model's)."""
    import re

    return not re.search(r"\s", re.sub(r'"(?:\\.|[^"\\])*"', '""', text))
