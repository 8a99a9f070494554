"""The engine on a CUDA device (CI has none; the device script runs these).

- logits of the CUDA path (Triton attention, fused kernels, CUDA graphs) against the CPU
  reference on the bundled tiny target, prefill and decode, fp32 and bf16;
- greedy SD against AR on the bundled pair in fp32 and bf16, every KV block free afterwards
  (exactness is a CPU test; on a GPU, kernels whose reduction order depends on the batch shape
  can flip near-ties, so agreement has a floor, not 1.0);
- with two or more GPUs: the three services with a two-rank tensor-parallel verifier (GPUs 0
  and 1) and the draft on GPU 1, NCCL data plane, fp32: greedy PSD, SD and AR output equal the
  single-GPU in-process AR engine's, token for token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest
import torch

from minedraft.bench.client import generate_all, put_policy
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.cli.local_stack import LocalStack
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.llm_engine import EngineConfig, LLMEngine
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from tests.gpu.stacks import running, two_gpu_stack

PROMPTS = ["def main(argv):\n    ", "import os\nimport sys\n\n\nclass ", "    return self._", "x = ",
           "for i in range(", "with open(path) as f:\n", "try:\n    import", "@property\ndef "] * 4
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
LOGIT_LIMIT = {torch.float32: 2e-3, torch.bfloat16: 3e-2}
AGREEMENT_FLOOR = 0.9  # measured 1.0 on an H200 in both dtypes; a broken speculative path lands far below


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@DTYPES
def test_cuda_logits_match_cpu_reference(dtype: torch.dtype, cuda_device: torch.device) -> None:
    ref = ModelRunner(load_model(TINY_TARGET, "cpu", torch.float32), 64, 16, "cpu")
    gpu = ModelRunner(load_model(TINY_TARGET, cuda_device, dtype), 64, 16, cuda_device)
    torch.manual_seed(0)
    ids = torch.randint(0, 2048, (3, 40)).tolist()
    errors = [relative(gpu.forward([0, 1, 2], ids, [0, 0, 0], last_n=40).cpu().float(),
                       ref.forward([0, 1, 2], ids, [0, 0, 0], last_n=40))]
    for pos in range(40, 48):  # decode steps through the CUDA-graph path
        tok = [[int(t)] for t in torch.randint(0, 2048, (3,))]
        want = ref.forward([0, 1, 2], tok, [pos] * 3, last_n=1)
        got = gpu.forward_ids([0, 1, 2], torch.tensor(tok, device=cuda_device), [pos] * 3, [1, 1, 1], last_n=1)
        errors.append(relative(got.cpu().float(), want))
    assert max(errors) < LOGIT_LIMIT[dtype], f"relative errors {[f'{e:.2e}' for e in errors]}"


@DTYPES
def test_greedy_sd_agrees_with_ar_and_frees_every_block(dtype: torch.dtype, cuda_device: torch.device,
                                                         record_property: Callable[[str, object], None]) -> None:
    common = {"device": str(cuda_device), "dtype": dtype, "max_num_seqs": 32, "num_blocks": 1024}
    ar = LLMEngine.from_folders(TINY_TARGET, None, EngineConfig(mode="ar", **common))
    sd = LLMEngine.from_folders(TINY_TARGET, TINY_DRAFT, EngineConfig(mode="sd", k=4, **common))
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    a = [r.output_ids for r in ar.generate(PROMPTS, params)]
    s = [r.output_ids for r in sd.generate(PROMPTS, params)]
    same = sum(x == y for ra, rs in zip(a, s, strict=True) for x, y in zip(ra, rs, strict=True))
    agreement = same / sum(len(r) for r in a)
    record_property("greedy_sd_ar_agreement", agreement)
    print(f"greedy SD vs AR on the bundled pair, {dtype}: token agreement {agreement:.4f}")
    for host in (sd.target, sd.draft, ar.target):
        assert host.runner.allocator.num_free == host.runner.allocator.num_blocks
    assert agreement >= AGREEMENT_FLOOR


@pytest.fixture(scope="module")
def tp_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    with running(two_gpu_stack(tmp_path_factory.mktemp("tp_logs"), tp_size=2, target_device="cuda:0,cuda:1")) as stack:
        yield stack


@pytest.fixture(scope="module")
def single_gpu_ar_outputs() -> tuple[list[list[int]], list[list[int]]]:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    tok = Tokenizer(TINY_TARGET)
    prompts = [tok.encode(p) for p in PROMPTS[:12]]
    common = {"device": "cuda:0", "dtype": torch.float32, "max_num_seqs": 32, "num_blocks": 1024}
    ar = LLMEngine.from_folders(TINY_TARGET, None, EngineConfig(mode="ar", **common))
    return prompts, [r.output_ids for r in ar.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))]


@pytest.mark.parametrize("mode", ["psd", "sd", "ar"])
def test_tensor_parallel_stack_equals_single_gpu_ar(mode: str, tp_stack: LocalStack,
                                                    single_gpu_ar_outputs: tuple[list[list[int]], list[list[int]]]
                                                    ) -> None:
    prompts, expected = single_gpu_ar_outputs
    put_policy(tp_stack.admin_port, mode=mode)
    got, _ = asyncio.run(generate_all(tp_stack.cfg.grpc_port, prompts, 40))
    assert got == expected
