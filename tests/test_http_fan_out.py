"""Units of the HTTP fan-out and formatting, over hand-made chunks and a fake backend (no engine): how n and
best_of become generations, how their streams are merged and closed, the three logprobs shapes, the chat
renderer's options."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from minedraft.batch_manager.backend import GenerationChunk
from minedraft.batch_manager.chat import RenderOptions, render_chat
from minedraft.batch_manager.choice_output import OutputOptions, PromptInfo
from minedraft.batch_manager.choices import child_params
from minedraft.batch_manager.fan_out import FanOut, best_candidates, plan_generations
from minedraft.batch_manager.http_streams import StreamSettings, chat_events, completion_body, completion_events
from minedraft.batch_manager.openai_logprobs import MASKED_LOGPROB, CompletionLogprobsBuilder, TokenNames, chat_logprobs
from minedraft.batch_manager.openai_models import ChatMessage
from minedraft.core.logprobs import TokenLogprob
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from tests.conftest import write_word_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    folder = tmp_path_factory.mktemp("tok")
    write_word_tokenizer(folder, 50, eos_id=1)
    return Tokenizer(folder)


def chunk(text: str, ids: list[int], finish: str | None = None, lp: list[TokenLogprob] | None = None,
          cumulative: float = 0.0, done: int = 0, prompt_lp: list[TokenLogprob | None] | None = None
          ) -> GenerationChunk:
    return GenerationChunk(text, ids, finish, 2, done + len(ids), None, lp, prompt_lp, cumulative)


def entry(token: int, logprob: float, top: list[tuple[int, float]]) -> TokenLogprob:
    return TokenLogprob(token, logprob, 1 + sum(1 for _, v in top if v > logprob), top)


class FakeStream:
    """A backend stream of given chunks; `fail_at`: how many it hands out before it raises."""

    def __init__(self, chunks: list[GenerationChunk], fail_at: int | None = None, delay: float = 0.0) -> None:
        self.chunks, self.fail_at, self.delay, self.closed, self.sent = list(chunks), fail_at, delay, False, 0

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> GenerationChunk:
        await asyncio.sleep(self.delay)
        if self.fail_at is not None and self.sent >= self.fail_at:
            raise RuntimeError("child failed")
        if not self.chunks:
            raise StopAsyncIteration
        self.sent += 1
        return self.chunks.pop(0)

    async def aclose(self) -> None:
        self.closed = True


class FakeBackend:
    model_name, max_context = "m", 64

    def __init__(self, streams: list[FakeStream]) -> None:
        self.streams, self.calls = streams, []

    def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str, deadline: float | None = None,
                 partial: bool = True, share_prompt: str | None = None) -> FakeStream:
        self.calls.append((request_id, params.seed, params.logprobs, share_prompt))
        return self.streams[len(self.calls) - 1]


class FakeRequest:
    async def receive(self) -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}


def test_candidates_are_seeded_s_plus_i_and_ranked_ones_carry_logprobs() -> None:
    seeded = child_params(SamplingParams(seed=7, temperature=1.0), 3, rank_by_logprob=True, prompt_logprobs_to_all=True)
    assert [p.seed for p in seeded] == [7, 8, 9] and [p.logprobs for p in seeded] == [0, 0, 0]
    unseeded = child_params(SamplingParams(logprobs=2), 2, rank_by_logprob=True, prompt_logprobs_to_all=True)
    assert [p.seed for p in unseeded] == [None, None] and [p.logprobs for p in unseeded] == [2, 2]
    plan = plan_generations("req", [[1, 2], [3]], SamplingParams(seed=1), 2)
    assert [(g.prompt_index, g.request_id, g.share_prompt, g.params.seed) for g in plan] == [
        (0, "req-0", "req-p0", 1), (0, "req-1", "req-p0", 2), (1, "req-2", "req-p1", 1), (1, "req-3", "req-p1", 2)]
    (single,) = plan_generations("req", [[1]], SamplingParams(), 1)
    assert single.request_id == "req" and single.share_prompt is None


def test_best_candidates_take_the_highest_cumulative_logprob_per_prompt() -> None:
    scores = [-5.0, -1.0, -3.0, -2.0, -9.0, -0.5]
    gens = [[chunk(str(s), [1], "stop", cumulative=s)] for s in scores]
    best = best_candidates(gens, candidates=3, n=2)
    assert [g[-1].cumulative_logprob for g in best] == [-1.0, -3.0, -0.5, -2.0]
    assert best_candidates(gens, candidates=2, n=2) == gens


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_merged_interleaves_children_and_collect_groups_them() -> None:
    async def go() -> tuple[list[tuple[int, str]], FakeBackend]:
        streams = [FakeStream([chunk("a", [1]), chunk("b", [2], "stop")], delay=0.01),
                   FakeStream([chunk("x", [3], "length")], delay=0.015)]
        backend = FakeBackend(streams)
        plan = plan_generations("r", [[1]], SamplingParams(), 2)
        fan = await FanOut.open(FakeRequest(), backend, plan, None, True, lambda g, s: s)  # type: ignore[arg-type]
        seen = [(i, c.text) async for i, c in fan.merged()]
        return seen, backend

    seen, backend = run(go())
    assert sorted(seen) == [(0, "a"), (0, "b"), (1, "x")] and seen.index((0, "a")) < seen.index((0, "b"))
    assert all(s.closed for s in backend.streams)
    assert [call[3] for call in backend.calls] == ["r-p0", "r-p0"]


def test_closing_the_merged_stream_closes_every_child() -> None:
    async def go() -> list[FakeStream]:
        streams = [FakeStream([chunk("a", [1])] + [chunk("a", [1])] * 50, delay=0.001) for _ in range(3)]
        plan = plan_generations("r", [[1]], SamplingParams(), 3)
        fan = await FanOut.open(FakeRequest(), FakeBackend(streams), plan, None, True,  # type: ignore[arg-type]
                                lambda g, s: s)
        merged = fan.merged()
        await anext(merged)
        await merged.aclose()
        return streams

    assert all(s.closed for s in run(go()))


def test_a_failing_child_closes_the_others_and_raises() -> None:
    async def go() -> list[FakeStream]:
        streams = [FakeStream([chunk("a", [1])] * 40, delay=0.001), FakeStream([chunk("b", [2])], fail_at=1)]
        plan = plan_generations("r", [[1]], SamplingParams(), 2)
        fan = await FanOut.open(FakeRequest(), FakeBackend(streams), plan, None, False,  # type: ignore[arg-type]
                                lambda g, s: s)
        with pytest.raises(RuntimeError, match="child failed"):
            await fan.collect()
        return streams

    assert all(s.closed for s in run(go()))


def test_completion_logprobs_include_the_sampled_token_and_ascend_offsets(tok: Tokenizer) -> None:
    builder = CompletionLogprobsBuilder(TokenNames(tok), top_n=1)
    greedy = entry(5, -0.25, [(5, -0.25), (7, -1.5)])
    sampled = entry(9, -2.0, [(3, -0.5), (9, -2.0)])
    masked = entry(4, -math.inf, [(8, -0.1)])
    part = builder.part([greedy, sampled, masked])
    assert part.tokens == ["w5", "w9", "w4"] and part.text_offset == [0, 2, 4]
    assert part.top_logprobs == [{"w5": -0.25}, {"w3": -0.5, "w9": -2.0}, {"w8": -0.1, "w4": MASKED_LOGPROB}]
    assert part.token_logprobs[0] == max(part.top_logprobs[0].values())  # greedy: exactly the top value
    ids = CompletionLogprobsBuilder(TokenNames(tok, as_token_ids=True), top_n=1).part([greedy])
    assert ids.tokens == ["token_id:5"] and ids.top_logprobs == [{"token_id:5": -0.25}]


def test_chat_logprobs_give_bytes_and_exactly_top_n(tok: Tokenizer) -> None:
    (item,) = chat_logprobs(TokenNames(tok), [entry(9, -2.0, [(3, -0.5), (9, -2.0), (4, -3.0)])], 2).content or []
    assert item.token == "w9" and item.bytes == list(b"w9") and item.logprob == -2.0
    assert [(t.token, t.logprob) for t in item.top_logprobs] == [("w3", -0.5), ("w9", -2.0)]


def test_completion_body_with_echo_and_prompt_logprobs(tok: Tokenizer) -> None:
    prompt_lp: list[TokenLogprob | None] = [None, entry(6, -1.0, [(2, -0.5)])]
    first = chunk("w7", [7], lp=[entry(7, -0.1, [(7, -0.1)])], prompt_lp=prompt_lp)
    last = chunk(" w8", [8], "length", lp=[entry(8, -0.2, [(8, -0.2)])], done=1)
    options = OutputOptions(TokenNames(tok), [PromptInfo([5, 6], "w5 w6 ")], 1, logprobs=1, prompt_logprobs=1,
                            echo_logprobs=True)
    body = completion_body(StreamSettings("id", "m"), options, [[first, last]]).model_dump()
    (choice,) = body["choices"]
    assert choice["text"] == "w5 w6 w7 w8"
    assert choice["logprobs"]["tokens"] == ["w5", "w6", "w7", "w8"]
    assert choice["logprobs"]["token_logprobs"] == [None, -1.0, -0.1, -0.2]
    assert choice["logprobs"]["top_logprobs"][0] is None and choice["logprobs"]["text_offset"] == [0, 2, 6, 8]
    assert choice["prompt_logprobs"] == [None, {"2": {"logprob": -0.5, "rank": 1, "decoded_token": "w2"},
                                                "6": {"logprob": -1.0, "rank": 2, "decoded_token": "w6"}}]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    dropped = OutputOptions(TokenNames(tok), [PromptInfo([5, 6], "w5 w6")], 1, drop_output=True)
    only = completion_body(StreamSettings("id", "m"), dropped, [[chunk("w7", [7], "stop")]]).model_dump()
    assert only["choices"][0]["text"] == "w5 w6" and only["usage"]["completion_tokens"] == 0
    missing = OutputOptions(TokenNames(tok), [PromptInfo([5], "")], 1, logprobs=0)
    assert completion_body(StreamSettings("id", "m"), missing, [[chunk("w7", [7], "stop")]]).choices[0].logprobs \
        is None  # a backend that sent no entries: null, never made-up values


async def indexed(items: list[tuple[int, GenerationChunk]]) -> AsyncIterator[tuple[int, GenerationChunk]]:
    for item in items:
        yield item


def events_of(stream: AsyncIterator[str]) -> list[dict[str, Any]]:
    async def go() -> list[str]:
        return [e async for e in stream]

    lines = run(go())
    assert lines[-1] == "data: [DONE]\n\n"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_streams_index_each_choice_and_sum_usage(tok: Tokenizer) -> None:
    options = OutputOptions(TokenNames(tok), [PromptInfo([5, 6], "")], 2, logprobs=0)
    items = [(1, chunk("w3", [3], lp=[entry(3, -1.0, [])])), (0, chunk("w4", [4], "stop", lp=[entry(4, -2.0, [])])),
             (1, chunk(" w5", [5], "length", lp=[entry(5, -3.0, [])], done=1))]
    settings = StreamSettings("id", "m", include_usage=True)
    *chunks, usage = events_of(completion_events(indexed(items), options, settings))
    assert [(c["choices"][0]["index"], c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks] \
        == [(1, "w3", None), (0, "w4", "stop"), (1, " w5", "length")]
    assert chunks[2]["choices"][0]["logprobs"]["text_offset"] == [2]  # continues its own choice's offsets
    assert usage["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    chat = events_of(chat_events(indexed(items), options, StreamSettings("id", "m")))
    finishes = [(c["choices"][0]["index"], c["choices"][0]["finish_reason"]) for c in chat
                if c["choices"][0]["finish_reason"]]
    assert finishes == [(0, "stop"), (1, "length")]
    first_of_1 = next(c["choices"][0]["delta"] for c in chat if c["choices"][0]["index"] == 1)
    assert first_of_1 == {"role": "assistant", "content": ""}


def test_renderer_options_change_the_prompt(tok: Tokenizer, tmp_path: Path) -> None:
    template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}"
                "<nothink>{% endif %}{% endif %}")
    messages = [ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="Once upon")]
    own = RenderOptions(template=template)
    assert render_chat(tok, messages, own) == "<user>hi</s><assistant>Once upon</s><assistant>"
    assert render_chat(tok, messages, RenderOptions(template=template, template_kwargs={"enable_thinking": False})) \
        == "<user>hi</s><assistant>Once upon</s><assistant><nothink>"
    assert render_chat(tok, messages, RenderOptions(False, template=template)) == "<user>hi</s><assistant>Once upon</s>"
    continued = render_chat(tok, messages, RenderOptions(False, True, template=template))
    assert continued == "<user>hi</s><assistant>Once upon"
    assert render_chat(tok, messages, RenderOptions(False, True)) == "user: hi\nassistant: Once upon"
    assert render_chat(tok, messages, RenderOptions(False)) == "user: hi\nassistant: Once upon\n"
