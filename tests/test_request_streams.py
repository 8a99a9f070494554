"""One chunk per step for a streaming caller, one chunk at the end for a caller that answers only then."""

from __future__ import annotations

import asyncio

import pytest

from minedraft.batch_manager.config import ManagerConfig
from minedraft.batch_manager.request_streams import RequestStreams
from minedraft.core.errors import InvalidRequestError
from minedraft.core.request import Request
from minedraft.core.sampling_params import SamplingParams
from tests.fake_worker_links import greedy
from tests.step_driver_support import Stack, drive
from tests.test_step_driver import PROMPTS, all_right, config, tokenizer  # noqa: F401  (fixture)


def produced(req: Request, tokens: list[int], text: str, finish: str | None = None) -> None:
    """What a verdict does to a request: tokens and text appended, maybe a finish."""
    req.output_ids += tokens
    req.text += text
    if finish:
        req.finish(finish)


def test_a_final_only_caller_gets_one_chunk_with_everything_even_across_a_preemption() -> None:
    streams = RequestStreams()
    streaming, final_only = (Request(i, [5, 6], SamplingParams(max_tokens=4)) for i in (1, 2))
    live, once = streams.open(streaming), streams.open(final_only, partial=False)
    for req in (streaming, final_only):
        produced(req, [7], "a")
        streams.notify(req)
    streams.renamed(2, 9)  # preempted: back under a new sequence id
    final_only.req_id = 9
    for req in (streaming, final_only):
        produced(req, [8, 9], "bc", finish="length")
        streams.notify(req)
    assert [(c.text, c.token_ids) for c in (live.get_nowait(), live.get_nowait())] == [("a", [7]), ("bc", [8, 9])]
    only = once.get_nowait()
    assert (only.text, only.token_ids, only.finish_reason, only.completion_tokens) == ("abc", [7, 8, 9], "length", 3)
    assert once.empty() and live.empty()
    streams.close(final_only)
    produced(final_only, [1], "x")
    streams.notify(final_only)  # closed: nothing goes anywhere, nothing fails


def test_the_step_loop_sends_a_unary_caller_its_whole_output_in_one_chunk(tokenizer) -> None:  # noqa: F811
    async def scenario() -> None:
        stack = Stack(tokenizer, config("psd", depth=2), all_right)
        await stack.coordinator.start()
        params = SamplingParams(max_tokens=9, ignore_eos=True)

        async def chunks(partial: bool) -> list:
            return [c async for c in stack.coordinator.generate(PROMPTS[0], params, "r", partial=partial)]

        streamed, unary = await asyncio.gather(chunks(True), chunks(False))
        assert len(streamed) > 1 and len(unary) == 1
        assert [t for c in streamed for t in c.token_ids] == unary[0].token_ids == greedy(PROMPTS[0], 9)
        assert "".join(c.text for c in streamed) == unary[0].text and unary[0].finish_reason == "length"
        await stack.settle()
        await stack.coordinator.stop()

    drive(scenario)


def test_a_stream_interval_holds_chunks_for_enough_tokens_but_never_the_first_or_the_last() -> None:
    streams = RequestStreams(stream_interval=3)
    req = Request(1, [5], SamplingParams(max_tokens=10))
    queue = streams.open(req)
    for tokens, text in (([7], "a"), ([8], "b"), ([9], "c"), ([10, 11], "de")):
        produced(req, tokens, text)
        streams.notify(req)
    produced(req, [12], "f", finish="stop")
    streams.notify(req)
    chunks = [queue.get_nowait() for _ in range(queue.qsize())]
    # the first at once (time to first token); then 1 and 2 new tokens wait, 4 go; the last at once
    assert [(c.text, c.token_ids) for c in chunks] == [("a", [7]), ("bcde", [8, 9, 10, 11]), ("f", [12])]
    assert chunks[-1].finish_reason == "stop"


def test_a_stream_interval_below_one_token_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="stream_interval must be >= 1"):
        ManagerConfig(stream_interval=0).validate()
