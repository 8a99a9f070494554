"""Streaming OpenAI HTTP requests with a timestamp per chunk, as a user of the API sees them.

Each request asks for the sampled token of every position by id (logprobs 0 with vLLM's
return_tokens_as_token_ids): a chunk then names its tokens even when the tokenizer has no text for them
(the synthetic GPU pair's vocabulary is far larger than the bundled tokenizer's), so time to first token,
the gaps between chunks and the greedy outputs compared across configurations all count tokens, not text.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import httpx

from minedraft.bench.latency import gaps

TOKEN_PREFIX = "token_id:"


@dataclass(slots=True)
class StreamRecord:
    """One streamed response: when it was sent, when each chunk that carried tokens arrived, what it said."""

    sent: float
    times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0

    @property
    def ttft(self) -> float:
        return self.times[0] - self.sent if self.times else float("inf")

    @property
    def first(self) -> float:
        return self.times[0] if self.times else float("inf")

    @property
    def end(self) -> float:
        return self.times[-1] if self.times else self.sent

    def intervals(self) -> list[tuple[float, float]]:
        """(previous chunk, this chunk) for every chunk after the first."""
        return list(pairwise(self.times))

    def gaps(self) -> list[float]:
        return gaps(self.times)


def completion_body(model: str, prompt: list[int], max_tokens: int, ignore_eos: bool = True) -> dict[str, Any]:
    """A greedy streamed /v1/completions request over token ids."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos, "logprobs": 0,
            "return_tokens_as_token_ids": True}


def chat_body(model: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """A greedy streamed /v1/chat/completions request (fixed answer length, so arms do equal work)."""
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "logprobs": True, "top_logprobs": 0,
            "return_tokens_as_token_ids": True}


def _ids(tokens: list[str]) -> list[int]:
    return [int(t.removeprefix(TOKEN_PREFIX)) for t in tokens if t.startswith(TOKEN_PREFIX)]


def _event_tokens(event: dict[str, Any], chat: bool) -> tuple[list[int], str]:
    """The token ids and text one server-sent event carries (none for the usage and role-only events)."""
    choices = event.get("choices") or []
    if not choices:
        return [], ""
    choice = choices[0]
    logprobs = choice.get("logprobs") or {}
    if chat:
        tokens = [entry["token"] for entry in logprobs.get("content") or []]
        return _ids(tokens), (choice.get("delta") or {}).get("content") or ""
    return _ids(logprobs.get("tokens") or []), choice.get("text") or ""


async def stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> StreamRecord:
    """POST `body` to `path` and read its events to the end; raises on an HTTP or in-band error."""
    chat = path.endswith("/chat/completions")
    record = StreamRecord(sent=time.perf_counter())
    texts: list[str] = []
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"{path}: HTTP {response.status_code}: {response.text[:300]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"{path}: {event['error']}")
            ids, text = _event_tokens(event, chat)
            if ids:
                record.times.append(time.perf_counter())
                record.token_ids.extend(ids)
            texts.append(text)
            if event.get("usage"):
                record.prompt_tokens = int(event["usage"].get("prompt_tokens", 0))
    record.text = "".join(texts)
    return record


def http_client(port: int, host: str = "127.0.0.1") -> httpx.AsyncClient:
    """One client for a whole workload: its pool holds a connection per concurrent stream."""
    return httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=httpx.Timeout(900.0),
                             limits=httpx.Limits(max_connections=512, max_keepalive_connections=512))


async def model_name(client: httpx.AsyncClient) -> str:
    response = await client.get("/v1/models")
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])
