"""A draft service killed mid-PSD on two GPUs (NCCL data plane, both workers launching ahead).

Over NCCL a receive from a dead peer never fails on its own, and the verifier's stream waits on the
posted receive of the next drafts: without the manager's DataPlaneAbort every request would stall until
the communicator's timeout. Here the longest pause in the step counter after the kill must stay well
under that, and every request must complete. (Outputs are compared with single-GPU AR; on a GPU a kernel
whose reduction order depends on the batch shape can flip a near-tie, so two rows may differ.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
import torch

from minedraft.bench.client import generate_all
from minedraft.bundled import TINY_TARGET
from minedraft.cli.local_stack import LocalStack
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.llm_engine import EngineConfig, LLMEngine
from tests.gpu.stacks import running, two_gpu_stack

NCCL_TIMEOUT_S = 20  # the data plane's default; a stall this long means the abort did not work
MAX_STALL_S = 5.0


@pytest.fixture(scope="module")
def split_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    with running(two_gpu_stack(tmp_path_factory.mktemp("loss_logs")), show_logs=True) as stack:
        yield stack


def test_killing_the_draft_mid_psd_stalls_nothing_for_long(split_stack: LocalStack) -> None:
    prompts = [[1, 5 + i, 9, 13 + 2 * i, 4] for i in range(16)]
    common = {"device": "cuda:0", "dtype": torch.float32, "max_num_seqs": 32, "num_blocks": 1024}
    ar = LLMEngine.from_folders(TINY_TARGET, None, EngineConfig(mode="ar", **common))
    expected = [r.output_ids for r in ar.generate(prompts, SamplingParams(max_tokens=160, ignore_eos=True))]
    del ar
    health = f"http://127.0.0.1:{split_stack.cfg.http_port}/health"

    async def run() -> tuple[list[list[int]], list[tuple[float, int]]]:
        trace: list[tuple[float, int]] = []
        job = asyncio.create_task(generate_all(split_stack.cfg.grpc_port, prompts, 160))
        async with httpx.AsyncClient(timeout=5) as client:
            start = (await client.get(health)).json()["step"]
            while (await client.get(health)).json()["step"] < start + 12:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(split_stack.kill, "draft")
            trace.append((time.monotonic(), -1))
            while not job.done():
                trace.append((time.monotonic(), (await client.get(health)).json()["step"]))
                await asyncio.sleep(0.02)
        return (await job)[0], trace

    got, trace = asyncio.run(run())
    assert [len(g) for g in got] == [160] * len(prompts)
    same = sum(g == e for g, e in zip(got, expected, strict=True))
    print(f"rows equal to single-GPU AR: {same} of {len(prompts)}")
    assert same >= len(prompts) - 2
    longest, last_t, last_step = 0.0, trace[0][0], -1
    for t, step in trace[1:]:
        if step != last_step:
            longest, last_t, last_step = max(longest, t - last_t), t, step
    longest = max(longest, trace[-1][0] - last_t)
    print(f"longest pause of the step counter after killing the draft: {longest:.2f} s")
    assert longest < MAX_STALL_S < NCCL_TIMEOUT_S
