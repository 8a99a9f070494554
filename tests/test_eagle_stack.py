"""EAGLE heads through the three real processes (CPU, gloo): PSD and SD with a head equal greedy AR."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from minedraft.cli.local_stack import LocalStack, StackConfig, free_port
from minedraft.core.sampling_params import SamplingParams
from tests.conftest import engine_from_folders, grpc_stream, http_stream
from tests.eagle_support import write_eagle_head


@pytest.fixture(scope="module")
def stack(random_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):
    target, _ = random_pair
    head = write_eagle_head(tmp_path_factory.mktemp("head"), target, "speculators-eagle3", seed=4, draft_vocab=70)
    cfg = StackConfig(target=str(target), draft=str(head), draft_kind="eagle", grpc_port=free_port(),
                      http_port=free_port(), k=3, num_blocks=1024, log_dir=tmp_path_factory.mktemp("logs"))
    s = LocalStack(cfg)
    s.start(timeout=120)
    yield s
    s.stop()


def reference(target: Path, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    engine = engine_from_folders(target, None, "ar", block_size=16, num_blocks=1024)
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in max_tokens]
    return [r.output_ids for r in engine.generate(prompts, params)]


def steps(stack: LocalStack) -> dict:
    return httpx.get(f"http://127.0.0.1:{stack.cfg.http_port}/health", timeout=5).json()["steps_by_kind"]


def test_concurrent_clients_get_exact_greedy_tokens_with_psd(stack: LocalStack, random_pair) -> None:
    prompts = [[(7 * i + j) % 90 + 2 for j in range(3 + (5 * i) % 40)] for i in range(12)]
    max_tokens = [8 + (i * 5) % 25 for i in range(12)]
    expected = reference(random_pair[0], prompts, max_tokens)
    before = steps(stack)

    async def run_all() -> list[list[int]]:
        return await asyncio.gather(*[(grpc_stream if i % 2 else http_stream)(stack, p, m, 0.05 * (i % 4))
                                      for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))])

    assert asyncio.run(run_all()) == expected
    assert steps(stack)["psd"] > before["psd"], "both batches should have been busy at once"


def test_single_request_runs_standard_sd_with_the_head(stack: LocalStack, random_pair) -> None:
    before = steps(stack)
    prompt = list(range(3, 45))  # longer than a block: the draft's first step has no states yet
    assert asyncio.run(grpc_stream(stack, prompt, 24, 0)) == reference(random_pair[0], [prompt], [24])[0]
    after = steps(stack)
    assert after["sd"] > before["sd"] and after["psd"] == before["psd"]
