"""OpenAI/vLLM request fields over the real HTTP app and an in-process engine: each field changes the answer
the way vLLM's does (or is a 400 naming it), not merely accepted."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.engine_backend import all_kv_free
from tests.http_surface_support import Served, serve

GREEDY = {"temperature": 0, "max_tokens": 8}
PROMPT = "w5 w9 w13"


@pytest.fixture(scope="module")
def served(random_pair: tuple[Path, Path]) -> Iterator[Served]:
    with serve(random_pair[0]) as s:
        yield s


def text_of(body: dict[str, Any], i: int = 0) -> str:
    return body["choices"][i]["text"]


def test_include_stop_str_in_output_keeps_the_stop_string(served: Served) -> None:
    free = text_of(served.complete(prompt=PROMPT, **GREEDY))
    stop = free.split()[2]
    cut = served.complete(prompt=PROMPT, stop=[stop], **GREEDY)
    kept = served.complete(prompt=PROMPT, stop=[stop], include_stop_str_in_output=True, **GREEDY)
    assert text_of(kept) == text_of(cut) + stop
    assert free.startswith(text_of(kept)) and kept["choices"][0]["finish_reason"] == "stop"


def test_truncate_prompt_tokens_keeps_the_last_tokens(served: Served) -> None:
    ids = [5, 6, 7, 8, 9, 10]
    truncated = served.complete(prompt=ids, truncate_prompt_tokens=3, **GREEDY)
    assert truncated["usage"]["prompt_tokens"] == 3
    assert text_of(truncated) == text_of(served.complete(prompt=ids[-3:], **GREEDY))
    text = served.complete(prompt="w5 w6 w7 w8 w9", truncate_prompt_tokens=2, **GREEDY)
    assert text_of(text) == text_of(served.complete(prompt="w8 w9", **GREEDY))


def test_batch_prompts_give_index_matched_choices_equal_to_single_requests(served: Served) -> None:
    prompts: list[Any] = ["w5 w9", "w3 w4 w5 w6"]
    batch = served.complete(prompt=prompts, **GREEDY)
    singles = [served.complete(prompt=p, **GREEDY) for p in prompts]
    assert [c["index"] for c in batch["choices"]] == [0, 1]
    assert [text_of(batch, i) for i in range(2)] == [text_of(s) for s in singles]
    assert batch["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in singles)
    assert batch["usage"]["completion_tokens"] == sum(s["usage"]["completion_tokens"] for s in singles)
    ids_batch = served.complete(prompt=[[7, 7, 7], [8, 9]], **GREEDY)
    assert text_of(ids_batch, 1) == text_of(served.complete(prompt=[8, 9], **GREEDY))


def test_n_with_a_seed_equals_single_requests_seeded_s_plus_i(served: Served) -> None:
    sampled = {"temperature": 1.0, "max_tokens": 8, "seed": 11}
    fanned = served.complete(prompt=PROMPT, n=3, **sampled)
    singles = [text_of(served.complete(prompt=PROMPT, **{**sampled, "seed": 11 + i})) for i in range(3)]
    assert [text_of(fanned, i) for i in range(3)] == singles
    assert len(set(singles)) > 1  # the seeds differ, so do the samples
    assert fanned["usage"]["prompt_tokens"] == 3  # the prompt counts once
    greedy = served.complete(prompt=PROMPT, n=2, **GREEDY)
    assert text_of(greedy, 0) == text_of(greedy, 1) == text_of(served.complete(prompt=PROMPT, **GREEDY))


def test_batch_times_n_indexes_prompt_major(served: Served) -> None:
    sampled = {"temperature": 1.0, "max_tokens": 6, "seed": 3, "n": 2}
    body = served.complete(prompt=["w5 w9", "w20 w21"], **sampled)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    second = served.complete(prompt="w20 w21", **sampled)
    assert [text_of(body, 2), text_of(body, 3)] == [text_of(second, 0), text_of(second, 1)]


def test_streaming_n_carries_each_index_and_its_own_finish(served: Served) -> None:
    sampled = {"temperature": 1.0, "max_tokens": 8, "seed": 5, "n": 3}
    unary = served.complete(prompt=PROMPT, **sampled)
    events = served.stream("/v1/completions", prompt=PROMPT, stream_options={"include_usage": True}, **sampled)
    *chunks, usage = events
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, list[str]] = defaultdict(list)
    for event in chunks:
        (choice,) = event["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"]:
            finishes[choice["index"]].append(choice["finish_reason"])
    assert [texts[i] for i in range(3)] == [text_of(unary, i) for i in range(3)]
    assert all(len(finishes[i]) == 1 for i in range(3))
    assert usage["choices"] == [] and usage["usage"] == unary["usage"]
    chat = served.stream("/v1/chat/completions", messages=[{"role": "user", "content": "w5"}], **sampled)
    assert {c["choices"][0]["index"] for c in chat} == {0, 1, 2}
    assert sum(1 for c in chat if c["choices"][0]["finish_reason"]) == 3


def test_echo_prefixes_the_prompt_and_max_tokens_zero_returns_it_alone(served: Served) -> None:
    plain = served.complete(prompt=PROMPT, **GREEDY)
    echoed = served.complete(prompt=PROMPT, echo=True, **GREEDY)
    assert text_of(echoed) == PROMPT + text_of(plain)
    only = served.complete(prompt=PROMPT, echo=True, max_tokens=0)
    assert text_of(only) == PROMPT and only["usage"]["completion_tokens"] == 0
    assert only["choices"][0]["finish_reason"] == "length"
    ids = served.complete(prompt=[5, 6], echo=True, max_tokens=0)
    assert text_of(ids) == "w5 w6"
    streamed = served.stream("/v1/completions", prompt=PROMPT, echo=True, **GREEDY)
    assert "".join(e["choices"][0]["text"] for e in streamed) == text_of(echoed)


def test_min_tokens_defers_the_stop_token(served: Served) -> None:
    first = served.complete(prompt=PROMPT, **GREEDY)
    token = int(text_of(first).split()[0].removeprefix("w"))
    stopped = served.complete(prompt=PROMPT, stop_token_ids=[token], **GREEDY)
    assert stopped["usage"]["completion_tokens"] == 1
    deferred = served.complete(prompt=PROMPT, stop_token_ids=[token], min_tokens=4, **GREEDY)
    assert deferred["usage"]["completion_tokens"] >= 4


def test_vllm_extras_at_their_defaults_change_nothing(served: Served) -> None:
    neutral = {"repetition_penalty": 1.0, "min_p": 0.0, "top_k": -1, "priority": 0, "skip_special_tokens": True,
               "spaces_between_special_tokens": True, "logprobs_mode": "raw_logprobs", "bad_words": [],
               "user": "u1", "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {}, "best_of": 1,
               "suffix": "", "response_format": {"type": "text"}, "return_tokens_as_token_ids": False}
    assert text_of(served.complete(prompt=PROMPT, **neutral, **GREEDY)) == text_of(
        served.complete(prompt=PROMPT, **GREEDY))


def test_chat_rendering_fields_change_the_prompt(served: Served) -> None:
    messages = [{"role": "user", "content": "w5 w9"}, {"role": "assistant", "content": "w20 w21"}]

    def count(**fields: Any) -> int:
        reply = served.client.post("/tokenize", json={"model": "random", "messages": messages, **fields})
        assert reply.status_code == 200, reply.text
        return reply.json()["count"]

    opened = count()  # "user: w5 w9\nassistant: w20 w21\nassistant:"
    assert count(add_generation_prompt=False) == opened - 1
    assert count(add_generation_prompt=False, continue_final_message=True) == opened - 1
    body = served.chat(messages=messages, add_generation_prompt=False, continue_final_message=True, **GREEDY)
    assert body["usage"]["prompt_tokens"] == opened - 1
    echoed = served.chat(messages=messages, echo=True, add_generation_prompt=False, continue_final_message=True,
                         **GREEDY)
    assert echoed["choices"][0]["message"]["content"] == "w20 w21" + body["choices"][0]["message"]["content"]


def test_tokenize_and_detokenize_round_trip(served: Served) -> None:
    tokens = served.client.post("/tokenize", json={"prompt": "w5 w9 w13", "return_token_strs": True}).json()
    assert tokens["tokens"] == [5, 9, 13] and tokens["count"] == 3 and tokens["token_strs"] == ["w5", "w9", "w13"]
    assert tokens["max_model_len"] == served.backend.max_context
    assert served.client.post("/detokenize", json={"tokens": [5, 9]}).json() == {"prompt": "w5 w9"}
    chat = served.chat(messages=[{"role": "user", "content": "w5"}], **GREEDY)
    counted = served.client.post("/tokenize", json={"messages": [{"role": "user", "content": "w5"}]}).json()
    assert counted["count"] == chat["usage"]["prompt_tokens"]
    bad = served.client.post("/detokenize", json={"tokens": [10**6]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    typo = served.client.post("/tokenize", json={"prompt": "w5", "add_special_token": True})
    assert typo.status_code == 400 and typo.json()["error"]["param"] == "add_special_token"


@pytest.mark.parametrize(("path", "payload", "param"), [
    ("/v1/completions", {"prompt": "w5", "max_tokenz": 3}, "max_tokenz"),
    ("/v1/completions", {"prompt": "w5", "suffix": "w9"}, "suffix"),
    ("/v1/completions", {"prompt": "w5", "best_of": 3, "stream": True}, "best_of"),
    ("/v1/completions", {"prompt": "w5", "best_of": 1, "n": 2}, "best_of"),
    ("/v1/completions", {"prompt": "w5", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "w5", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "w5", "bad_words": ["w9"]}, "bad_words"),
    ("/v1/completions", {"prompt": "w5", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "w5", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ("/v1/completions", {"prompt": "w5", "response_format": {"type": "json_schema"}}, "response_format"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": "w5", "logprobs_mode": "odd"}, "logprobs_mode"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"continue_final_message": True}, "continue_final_message"),
    ("/v1/chat/completions", {"chat_template": "{% if %}"}, "chat_template"),
])
def test_refused_fields_are_400_naming_them(served: Served, path: str, payload: dict[str, Any], param: str) -> None:
    if path.endswith("chat/completions"):
        payload = {"messages": [{"role": "user", "content": "w5"}], **payload}
    reply = served.client.post(path, json=payload)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and param in error["message"]


def test_neutral_chat_fields_are_accepted(served: Served) -> None:
    fields = {"tool_choice": "none", "response_format": {"type": "text"}, "metadata": {"k": "v"}, "store": False,
              "service_tier": "auto", "user": "u", "reasoning_effort": "low", "parallel_tool_calls": True,
              "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "max_completion_tokens": 4,
              "chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True}
    events = served.stream("/v1/chat/completions", messages=[{"role": "user", "content": "w5"}], **fields)
    assert events[-1]["usage"]["completion_tokens"] == 4
    assert all(e["usage"] is not None for e in events)  # continuous_usage_stats: on every chunk


def test_logit_bias_and_allowed_token_ids_reach_the_sampler(served: Served) -> None:
    forced = served.complete(prompt=PROMPT, logit_bias={"42": 100}, **GREEDY)
    assert text_of(forced).split() == ["w42"] * 8
    allowed = served.complete(prompt=PROMPT, allowed_token_ids=[30, 31], **GREEDY)
    assert set(text_of(allowed).split()) <= {"w30", "w31"}


def test_vllm_prompt_logprobs_field_has_vllms_shape(served: Served) -> None:
    body = served.complete(prompt=[5, 6, 7], prompt_logprobs=2, **GREEDY)
    first, *rest = body["choices"][0]["prompt_logprobs"]
    assert first is None and len(rest) == 2
    for token, ranked in zip([6, 7], rest, strict=True):
        assert str(token) in ranked and 2 <= len(ranked) <= 3
        assert {e["rank"] for e in ranked.values()} >= {1, 2}
        assert ranked[str(token)]["decoded_token"] == f"w{token}"


def test_a_client_leaving_a_streamed_n_aborts_every_choice(served: Served) -> None:
    backend = served.backend
    aborted = backend.status()["aborted"]
    payload = {"model": "random", "prompt": "w5 w9", "max_tokens": 200, "ignore_eos": True, "stream": True, "n": 3,
               "temperature": 1.0}
    with served.client.stream("POST", "/v1/completions", json=payload) as reply:
        next(line for line in reply.iter_lines() if line.startswith("data: "))
        backend.pause()  # from here only the aborts can free the choices' blocks
    try:
        wait_until(lambda: backend.status()["aborted"] == aborted + 3 and all_kv_free(backend.status()))
    finally:
        backend.resume()
