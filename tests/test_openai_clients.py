"""Real clients against the HTTP app over an in-process engine: the exact payloads of vLLM's benchmark client
(`vllm bench serve`, which sends repetition_penalty and logprobs: null), the openai SDK with batch prompts, n,
logprobs and echo, chat logprobs; best_of picks the candidates with the highest cumulative logprob."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.http_surface_support import MODEL, Served, serve


@pytest.fixture(scope="module")
def served(random_pair: tuple[Path, Path]) -> Iterator[Served]:
    with serve(random_pair[0]) as s:
        yield s


@pytest.fixture(scope="module")
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)


def test_vllm_bench_serve_completions_payload_streams(served: Served) -> None:
    """vllm/benchmarks/lib/endpoint_request_func.py, async_request_openai_completions (with --ignore-eos)."""
    payload = {"model": MODEL, "prompt": "w5 w9 w13", "repetition_penalty": 1.0, "max_tokens": 6, "logprobs": None,
               "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    with served.client.stream("POST", "/v1/completions", json=payload) as reply:
        assert reply.status_code == 200
        lines = [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    assert '"completion_tokens":6' in lines[-2] and '"choices":[]' in lines[-2]


def test_vllm_bench_serve_chat_payload_streams(served: Served) -> None:
    """The chat variant: content parts, max_completion_tokens, include_usage."""
    payload = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "w5 w9"}]}],
               "max_completion_tokens": 5, "stream": True, "stream_options": {"include_usage": True},
               "ignore_eos": True}
    events = served.stream("/v1/chat/completions", **{k: v for k, v in payload.items() if k not in ("model",
                                                                                                     "stream")})
    assert events[-1]["usage"]["completion_tokens"] == 5
    assert any(e["choices"] and e["choices"][0]["delta"].get("content") for e in events)


def test_sdk_completions_with_batch_n_logprobs_and_echo(client: openai.OpenAI) -> None:
    greedy: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_tokens": 5}
    batch = client.completions.create(prompt=["w5 w9", "w20"], n=2, logprobs=2, **greedy)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    single = client.completions.create(prompt="w20", logprobs=2, **greedy)
    assert batch.choices[2].text == batch.choices[3].text == single.choices[0].text
    lp = single.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert "".join(lp.tokens) == single.choices[0].text.replace(" ", "")
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert chosen == max(top.values())  # greedy: the chosen token's value is exactly the top one
        assert len(top) == 2
    echoed = client.completions.create(prompt="w20", echo=True, logprobs=1, **greedy)
    elp = echoed.choices[0].logprobs
    assert echoed.choices[0].text.startswith("w20")
    assert elp is not None and elp.tokens is not None and elp.token_logprobs is not None
    assert elp.tokens[0] == "w20" and elp.token_logprobs[0] is None
    assert elp.token_logprobs[1:] == lp.token_logprobs


def test_sdk_echo_max_tokens_zero_scores_the_prompt(client: openai.OpenAI) -> None:
    """What evaluation harnesses send to score a text: echo, max_tokens=0, logprobs."""
    scored = client.completions.create(model=MODEL, prompt="w5 w9 w13", echo=True, max_tokens=0, logprobs=0)
    choice = scored.choices[0]
    assert choice.text == "w5 w9 w13" and scored.usage is not None and scored.usage.completion_tokens == 0
    assert choice.logprobs is not None and choice.logprobs.tokens == ["w5", "w9", "w13"]
    values = choice.logprobs.token_logprobs or []
    assert values[0] is None and all(isinstance(v, float) and v < 0 for v in values[1:])


def test_sdk_chat_logprobs_and_top_logprobs(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "w5 w9"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=4, logprobs=True,
                                          top_logprobs=3)
    content = chat.choices[0].logprobs.content if chat.choices[0].logprobs else None
    assert content is not None and len(content) == chat.usage.completion_tokens  # type: ignore[union-attr]
    assert "".join(t.token for t in content) == (chat.choices[0].message.content or "").replace(" ", "")
    for token in content:
        assert len(token.top_logprobs) == 3 and token.logprob == token.top_logprobs[0].logprob
        assert token.bytes == list(token.token.encode())
    streamed = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=4,
                                              logprobs=True, top_logprobs=3, stream=True)
    tokens = [t.token for c in streamed if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.content or []]
    assert tokens == [t.token for t in content]
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=MODEL, messages=messages, top_logprobs=2)


def test_best_of_returns_the_candidates_with_the_highest_cumulative_logprob(served: Served) -> None:
    sampled = {"prompt": "w5 w9", "temperature": 1.0, "max_tokens": 4, "seed": 21}
    best = served.complete(best_of=4, n=2, **sampled)
    assert [c["logprobs"] for c in best["choices"]] == [None, None]  # not asked for: stripped
    scores = {}
    for i in range(4):
        single = served.complete(**{**sampled, "seed": 21 + i}, logprobs=0)["choices"][0]
        scores[single["text"]] = sum(single["logprobs"]["token_logprobs"])
    ranked = sorted(scores, key=scores.__getitem__, reverse=True)
    assert [c["text"] for c in best["choices"]] == ranked[:2]
    with pytest.raises(openai.BadRequestError, match="best_of"):
        openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0).completions.create(
            model=MODEL, prompt="w5", best_of=2, stream=True)
