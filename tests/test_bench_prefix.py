"""The serving benchmarks' workload code (bench/prefix_cache.py, bench/chunked_prefill.py) at tiny sizes, so it
cannot rot: its pure parts (percentiles, the gaps a prefill window catches, prompts that share exactly the
prefix, turns that extend the conversation, never-repeating corpus slices) and each workload run once
against one real stack of the bundled pair (caching on, a small prefill budget so a long prompt is chunked)."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from minedraft.bench import chunked_prefill, prefix_cache
from minedraft.bench.arm_stacks import (
    Arm,
    build,
    colocated,
    cpu_stack,
    placed,
    prefix_stats,
    start_all,
    stats_delta,
    stop_all,
)
from minedraft.bench.client import fetch_status
from minedraft.bench.latency import gaps, overlapping, percentile
from minedraft.bench.prompt_corpus import Corpus
from minedraft.bench.sse_client import StreamRecord, http_client, model_name
from minedraft.bundled import TINY_TARGET
from minedraft.core.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return Corpus(Tokenizer(str(TINY_TARGET)), min_tokens=20000)


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([float(x) for x in range(101)], 99) == 99.0
    assert percentile([1.0, 2.0], 100) == 2.0 and percentile([1.0, 2.0], 0) == 1.0
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) == 0.0
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_window_gaps_count_each_stretched_gap_once() -> None:
    assert gaps([1.0, 2.0, 4.0]) == [1.0, 2.0]
    assert overlapping([(0.0, 1.0), (1.0, 3.0), (3.0, 4.0)], 1.5, 2.0) == [(1.0, 3.0)]
    stream = StreamRecord(sent=0.0, times=[1.0, 2.0, 3.0, 10.0, 11.0, 12.0])
    longs = [StreamRecord(sent=3.5, times=[9.5]), StreamRecord(sent=4.0, times=[10.5])]
    # (3, 10) overlaps both windows but is one gap; (10, 11) overlaps the second; the rest overlap neither.
    assert chunked_prefill.window_gaps([stream], longs) == [7.0, 1.0]
    row = chunked_prefill.summarize("arm", [{"streams": [stream], "longs": longs}])
    assert row["gap_max_ms"] == 7000.0 and row["gap_p50_all_ms"] == 1000.0 and row["max_over_median"] == 7.0
    assert row["first_token_while_streams_ran"] == 2 and row["long_ttft_max_ms"] == 6500.0


def test_corpus_hands_out_each_slice_once(corpus: Corpus) -> None:
    start = corpus.used
    first, second = corpus.take(100), corpus.take(50)
    assert first == corpus.ids[start : start + 100] and second == corpus.ids[start + 100 : start + 150]
    with pytest.raises(ValueError):
        corpus.take(len(corpus.ids))


def test_shared_prefix_prompts_share_exactly_the_prefix(corpus: Corpus) -> None:
    work = prefix_cache.shared_prefix(corpus, 5, 64, 16)
    prompts = work.prompts()
    assert all(p[:64] == work.prefix and len(p) == 80 for p in prompts)
    assert len({tuple(p[64:]) for p in prompts}) == 5  # suffixes differ ...
    assert all(p[64:80] != work.prefix[:16] for p in prompts)  # ... and do not repeat the prefix


def test_chat_turns_extend_the_previous_conversation(corpus: Corpus) -> None:
    script = prefix_cache.chat_script(corpus, 2, 3, 32, 24)
    assert script.users[0] != script.users[1] and len(script.users[0]) == 3
    first = prefix_cache.next_turn([{"role": "system", "content": script.system}], None, script.users[0][0])
    second = prefix_cache.next_turn(first, "an answer", script.users[0][1])
    assert second[: len(first)] == first
    assert second[len(first):] == [{"role": "assistant", "content": "an answer"},
                                   {"role": "user", "content": script.users[0][1]}]


def test_workloads_on_a_real_stack(corpus: Corpus) -> None:
    stack = cpu_stack(Arm("on", enable_prefix_caching=True, max_num_batched_tokens=32), 8, 512)
    start_all([stack], timeout=120)
    port = stack.cfg.http_port
    try:
        work = prefix_cache.shared_prefix(corpus, 3, 64, 16)
        script = prefix_cache.chat_script(corpus, 2, 2, 32, 24)

        async def prefix_workloads() -> tuple:
            async with http_client(port) as client:
                model = await model_name(client)
                before = prefix_stats(fetch_status(port))
                shared = await prefix_cache.run_shared(client, model, work, 4)
                middle = prefix_stats(fetch_status(port))
                chat = await prefix_cache.run_chat(client, model, script, 4)
                return shared, chat, stats_delta(middle, before), stats_delta(prefix_stats(fetch_status(port)), middle)

        (lead, rest, wall), (turns, _), shared_hits, chat_hits = asyncio.run(prefix_workloads())
        assert wall > 0 and all(len(r.token_ids) == 4 and r.ttft < 60 and r.prompt_tokens == 80 for r in [lead, *rest])
        assert shared_hits["target"]["hits"] >= 2 * 64  # the followers found the leader's prefix
        assert all(t[1].prompt_tokens > t[0].prompt_tokens + 24 for t in turns)
        assert chat_hits["target"]["hits"] >= 2 * 32  # each second turn found its first turn's blocks

        args = argparse.Namespace(stream_tokens=40, long_max_tokens=2, settle_ms=50, pause_ms=0)
        streams = [corpus.take(chunked_prefill.STREAM_PROMPT) for _ in range(2)]
        result = asyncio.run(chunked_prefill.run_round(port, streams, [corpus.take(200)], args))
        assert [len(s.token_ids) for s in result["streams"]] == [40, 40] and len(result["longs"][0].token_ids) == 2
        row = chunked_prefill.summarize("chunked", [result])
        assert row["gap_p50_all_ms"] > 0 and row["long_ttft_p50_ms"] > 0
    finally:
        stop_all([stack])


@pytest.mark.parametrize("placement", ["colocated", "psd"])
def test_the_gpu_arms_stacks_place_the_pair_as_asked(placement: str) -> None:
    """What each arm of `bench prefix-cache --device cuda` starts (no process here: the configs it would run)."""
    arms = [Arm("on"), Arm("off", enable_prefix_caching=False, max_num_batched_tokens=512)]
    on, off = build("cuda", arms, 64, 4096, 0.7, placement)
    assert (on.cfg.enable_prefix_caching, off.cfg.enable_prefix_caching) == (True, False)
    assert off.cfg.max_num_batched_tokens == 512
    for stack in (on, off):
        assert stack.cfg.target_device == "cuda:0" and stack.cfg.target.startswith("synthetic:llama3-8b:target")
        assert stack.cfg.extra_env["MINEDRAFT_CAPTURE_K"] == "4"
        if placement == "psd":
            assert not colocated(stack) and stack.cfg.mode == "psd" and stack.cfg.draft_device == "cuda:1"
            assert stack.cfg.data_plane_backend == "nccl" and stack.cfg.extra_env["NCCL_NVLS_ENABLE"] == "0"
        else:
            assert colocated(stack) and stack.cfg.mode == "sd"
    args = argparse.Namespace(device="cuda", placement=placement)
    assert placed(args) == {"colocated": "device cuda, SD colocated on one GPU",
                            "psd": "device cuda, PSD: verifier on GPU 0, draft service on GPU 1"}[placement]
