"""End to end through the three real processes (loopback, CPU, gloo)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import httpx
import pytest

from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.core.sampling_params import SamplingParams
from minedraft.proto import generation_pb2, generation_pb2_grpc
from tests.conftest import engine_from_folders, grpc_stream, http_stream, wait_until, worker_info

NUM_BLOCKS = 1024


@pytest.fixture(scope="module")
def stack(random_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):
    target, draft = random_pair
    # Both workers launch ahead (the GPU default) here too, so every test below runs those paths.
    cfg = StackConfig(target=str(target), draft=str(draft), grpc_port=free_port(), http_port=free_port(), k=3,
                      num_blocks=NUM_BLOCKS, log_dir=tmp_path_factory.mktemp("logs"),
                      process_env={"verifier": {"MINEDRAFT_LAUNCH_AHEAD": "on"},
                                   "draft": {"MINEDRAFT_LAUNCH_AHEAD": "on"}})
    s = LocalStack(cfg)
    s.start(timeout=120)
    yield s
    s.stop()


def reference(random_pair, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    """What `minedraft generate --mode ar` gives: the in-process engine, greedy."""
    engine = engine_from_folders(random_pair[0], None, "ar", block_size=16, num_blocks=1024)
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in max_tokens]
    return [r.output_ids for r in engine.generate(prompts, params)]


def health(stack: LocalStack) -> dict:
    return httpx.get(f"http://127.0.0.1:{stack.cfg.http_port}/health", timeout=5).json()


def test_32_concurrent_streaming_clients_get_exact_greedy_tokens(stack, random_pair) -> None:
    prompts = [[(7 * i + j) % 90 + 2 for j in range(3 + i % 9)] for i in range(32)]
    max_tokens = [8 + (i * 5) % 33 for i in range(32)]
    expected = reference(random_pair, prompts, max_tokens)
    before = health(stack)["steps_by_kind"]
    queued_before = health(stack)["timing_totals"].get("verify_plan_queued_ms", 0.0)

    async def run_all() -> list[list[int]]:
        calls = [
            (grpc_stream if i % 2 else http_stream)(stack, p, m, delay=0.05 * (i % 8))
            for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))
        ]
        return await asyncio.gather(*calls)

    got = asyncio.run(run_all())
    assert got == expected
    after = health(stack)["steps_by_kind"]
    assert after["psd"] > before["psd"], "both batches should have been busy at once"
    # Plans are issued two steps ahead, so the verifier finds some already waiting in its inbox.
    assert health(stack)["timing_totals"]["verify_plan_queued_ms"] > queued_before
    assert stack.cfg.log_dir is not None
    assert "verifies are launched ahead" in (stack.cfg.log_dir / "verifier.log").read_text()
    assert "drafts are launched from verdicts on the device" in (stack.cfg.log_dir / "draft.log").read_text()


def test_single_request_runs_standard_sd(stack, random_pair) -> None:
    before = health(stack)["steps_by_kind"]
    got = asyncio.run(grpc_stream(stack, [5, 6, 7], 20, 0))
    assert got == reference(random_pair, [[5, 6, 7]], [20])[0]
    after = health(stack)["steps_by_kind"]
    assert after["psd"] == before["psd"] and after["sd"] > before["sd"]


def test_cancel_mid_stream_frees_kv_blocks_on_both_workers(stack) -> None:
    async def cancel_after_two_chunks() -> int:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.cfg.grpc_port}") as channel:
            stub = generation_pb2_grpc.GenerationStub(channel)
            request = generation_pb2.GenerateRequest(
                token_ids=generation_pb2.TokenIds(ids=list(range(2, 60))),
                sampling=generation_pb2.SamplingParameters(max_tokens=150, temperature=0.0, ignore_eos=True),
            )
            call = stub.GenerateStream(request)
            seen = 0
            async for _ in call:
                seen += 1
                if seen == 2:
                    call.cancel()
                    break
            return seen

    assert asyncio.run(cancel_after_two_chunks()) == 2
    for port in (stack.target_port, stack.draft_port):
        wait_until(lambda port=port: worker_info(port).free_blocks == NUM_BLOCKS, timeout=30)
        assert worker_info(port).sequences == 0
    assert health(stack)["running"] == 0


def test_draft_loss_falls_back_to_ar_and_recovers(stack, random_pair) -> None:
    prompts = [[3 + i, 4, 5 + i, 9] for i in range(6)]
    expected = reference(random_pair, prompts, [120] * 6)

    async def run_with_kill() -> list[list[int]]:
        tasks = [asyncio.create_task(grpc_stream(stack, p, 120, 0)) for p in prompts]
        while health(stack)["step"] < 12:
            await asyncio.sleep(0.05)
        stack.kill("draft")
        return await asyncio.gather(*tasks)

    got = asyncio.run(run_with_kill())
    assert got == expected
    status = health(stack)
    assert status["fallbacks"] >= 1 and status["steps_by_kind"]["ar"] > 0
    stack.start_draft()
    wait_until(lambda: health(stack)["draft_connected"], timeout=60)
    before = health(stack)["steps_by_kind"]

    async def rerun() -> list[list[int]]:
        return await asyncio.gather(*[grpc_stream(stack, p, 30, 0) for p in prompts])

    again = asyncio.run(rerun())
    assert again == [e[:30] for e in expected]
    after = health(stack)["steps_by_kind"]
    assert after["psd"] > before["psd"]


def test_openai_client_against_the_stack(stack) -> None:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{stack.cfg.http_port}/v1", api_key="unused")
    model = client.models.list().data[0].id
    done = client.completions.create(model=model, prompt="w5 w6 w7", max_tokens=6, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 6
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=model, prompt="w5 w6 w7", max_tokens=6, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
    )
    assert streamed == done.choices[0].text
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "w9 w10"}],
                                          max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 5
    pieces = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "w9 w10"}],
                                            max_tokens=5, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].delta.content or "" for c in pieces) == chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=model, prompt="w1", max_tokens=3, temperature=-1)


def test_live_policy_changes_mid_generation_keep_every_token(stack, random_pair) -> None:
    prompts = [[11 + i, 12, 13 + i] for i in range(6)]
    expected = reference(random_pair, prompts, [90] * 6)
    url = f"http://127.0.0.1:{stack.admin_port}/admin/policy"

    async def run_with_switches() -> list[list[int]]:
        tasks = [asyncio.create_task(grpc_stream(stack, p, 90, 0)) for p in prompts]
        async with httpx.AsyncClient(timeout=60) as client:
            for policy in ({"mode": "sd"}, {"mode": "ar"}, {"mode": "psd", "k": 2, "pipeline_depth": 3},
                           {"draft_selection": "tetris", "tetris_min_batch": 1},
                           {"mode": "auto", "k": 3, "pipeline_depth": 1, "draft_selection": "fixed"}):
                start = health(stack)["step"]
                while health(stack)["step"] < start + 4 and not all(t.done() for t in tasks):
                    await asyncio.sleep(0.02)
                resp = await client.put(url, json=policy)
                assert resp.status_code == 200, resp.text
        return await asyncio.gather(*tasks)

    assert asyncio.run(run_with_switches()) == expected
    bad = httpx.put(url, json={"mode": "turbo"}, timeout=10)
    assert bad.status_code == 400 and "mode" in bad.text
    too_deep = httpx.put(url, json={"pipeline_depth": 9}, timeout=10)
    assert too_deep.status_code == 400 and "pipeline_depth" in too_deep.text
    final = httpx.put(url, json={"mode": "psd", "k": 3, "pipeline_depth": 2}, timeout=10)
    assert final.json() == {"mode": "psd", "k": 3, "k_min": 1, "max_num_seqs": 64, "pipeline_depth": 2,
                            "rebalance_threshold": 0.0, "auto_min_tokens_per_step": 1.3, "auto_probe_steps": 200,
                            "draft_selection": "fixed", "tetris_extra": 3, "tetris_min_batch": 1}


def test_seeded_sampled_requests_match_the_in_process_engine_exactly(stack, random_pair) -> None:
    """Per-request counter-based randomness: the same seed gives the same tokens in PSD across
    three processes as in the single-process SD engine, which proves the draft distributions
    crossed the data plane bit for bit (the verifier judges with exactly the q the draft used)."""
    prompts = [[2 + i, 30, 31, 32 + i] for i in range(6)]
    sampling = {"temperature": 0.9, "top_p": 0.95, "top_k": 40}
    engine = engine_from_folders(random_pair[0], random_pair[1], "sd", k=3, block_size=16, num_blocks=1024)
    params = [SamplingParams(max_tokens=40, seed=1000 + i, ignore_eos=True, **sampling) for i in range(6)]
    expected = [r.output_ids for r in engine.generate(prompts, params)]

    async def one(i: int) -> list[int]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.cfg.grpc_port}") as channel:
            stub = generation_pb2_grpc.GenerationStub(channel)
            request = generation_pb2.GenerateRequest(
                token_ids=generation_pb2.TokenIds(ids=prompts[i]),
                sampling=generation_pb2.SamplingParameters(max_tokens=40, seed=1000 + i, ignore_eos=True,
                                                           **sampling),
            )
            return list((await stub.Generate(request, timeout=120)).token_ids)

    async def run_all() -> list[list[int]]:
        return await asyncio.gather(*(one(i) for i in range(6)))

    assert asyncio.run(run_all()) == expected


def test_stop_strings_and_eos_end_requests_through_the_services(stack, random_pair) -> None:
    free = reference(random_pair, [[5, 6, 7]], [30])[0]
    stop_word = f"w{free[10]}"
    first = next(i for i, t in enumerate(free) if f"w{t}" == stop_word)
    body = {"model": "target", "prompt": [5, 6, 7], "max_tokens": 30, "temperature": 0, "ignore_eos": True,
            "stop": [stop_word]}
    resp = httpx.post(f"http://127.0.0.1:{stack.cfg.http_port}/v1/completions", json=body, timeout=60).json()
    assert resp["choices"][0]["finish_reason"] == "stop"
    assert resp["choices"][0]["text"].split() == [f"w{t}" for t in free[:first]]


def test_lost_verifier_gives_unavailable_not_a_hang(random_pair, tmp_path) -> None:
    target, draft = random_pair
    cfg = StackConfig(target=str(target), draft=str(draft), grpc_port=free_port(), http_port=free_port(), k=3,
                      mode="ar", num_blocks=256, log_dir=tmp_path)
    s = LocalStack(cfg)
    try:
        s.start(timeout=120)
        assert asyncio.run(grpc_stream(s, [5, 6], 4, 0)) != []
        s.kill("verifier")
        url = f"http://127.0.0.1:{cfg.http_port}"
        wait_until(lambda: httpx.get(f"{url}/health", timeout=5).json()["status"] == "unavailable" and httpx.post(
            f"{url}/v1/completions", json={"prompt": [5], "max_tokens": 2}, timeout=10).status_code == 503)
        assert httpx.get(f"{url}/health", timeout=5).status_code == 503  # not ready: out of the Service
        with grpc.insecure_channel(f"127.0.0.1:{cfg.grpc_port}") as channel:
            stub = generation_pb2_grpc.GenerationStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.Generate(generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=[5])), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        s.stop()


def test_auto_mode_stops_drafting_when_the_draft_does_not_pay(stack, random_pair) -> None:
    """The random draft almost never agrees with the random target: auto falls back to AR steps."""
    url = f"http://127.0.0.1:{stack.admin_port}/admin/policy"
    assert httpx.put(url, json={"mode": "auto"}, timeout=60).status_code == 200
    try:
        prompts = [[20 + i, 21, 22] for i in range(4)]
        before = health(stack)["steps_by_kind"]

        async def run_all() -> list[list[int]]:
            return await asyncio.gather(*(grpc_stream(stack, p, 60, 0) for p in prompts))

        assert asyncio.run(run_all()) == reference(random_pair, prompts, [60] * 4)
        after = health(stack)["steps_by_kind"]
        assert after["ar"] > before["ar"] and after["psd"] + after["sd"] > before["psd"] + before["sd"]
    finally:
        httpx.put(url, json={"mode": "psd"}, timeout=60)


def test_every_eos_id_of_the_model_config_ends_requests_as_in_the_engine(random_pair, tmp_path) -> None:
    """config.json may list several end-of-sequence ids (Llama 3.1 lists three); the served stack
    stops on each of them, like the in-process engine, not only on the tokenizer's eos token."""
    import shutil

    prompt = [4, 8, 15]
    free = reference(random_pair, [prompt], [30])[0]
    extra_eos = next(t for t in free[3:] if t != 1)
    target = tmp_path / "target"
    shutil.copytree(random_pair[0], target)
    config = json.loads((target / "config.json").read_text())
    config["eos_token_id"] = [1, extra_eos]
    (target / "config.json").write_text(json.dumps(config))
    engine = engine_from_folders(target, None, "ar", block_size=16, num_blocks=256)
    expected = engine.generate([prompt], [SamplingParams(max_tokens=30)])[0].output_ids
    assert len(expected) < 30 and expected[-1] == extra_eos

    cfg = StackConfig(target=str(target), draft=str(random_pair[1]), grpc_port=free_port(), http_port=free_port(),
                      k=3, num_blocks=256, log_dir=tmp_path / "logs")
    s = LocalStack(cfg)
    try:
        s.start(timeout=120)
        with grpc.insecure_channel(f"127.0.0.1:{cfg.grpc_port}") as channel:
            stub = generation_pb2_grpc.GenerationStub(channel)
            request = generation_pb2.GenerateRequest(
                token_ids=generation_pb2.TokenIds(ids=prompt),
                sampling=generation_pb2.SamplingParameters(max_tokens=30, temperature=0.0),
            )
            response = stub.Generate(request, timeout=60)
        assert list(response.token_ids) == expected
    finally:
        s.stop()
