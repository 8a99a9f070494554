"""The decode GEMV path (CausalLM.use_decode_gemv) in the engine on a CUDA device: the bundled tiny target's
decode logits with it against the CPU float32 reference, eagerly and through CUDA graphs, at batch 1 and at
the path's largest token count; a step wider than that takes the unfused path and still matches."""

from __future__ import annotations

import pytest
import torch

from minedraft.bundled import TINY_TARGET
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from tests.gpu.test_engine_on_cuda import LOGIT_LIMIT, relative


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("batch", [1, 16])
def test_gemv_decode_logits_match_cpu_reference(cuda_device: torch.device, graphs: bool, batch: int) -> None:
    ref = ModelRunner(load_model(TINY_TARGET, "cpu", torch.float32), 256, 16, "cpu")
    model = load_model(TINY_TARGET, cuda_device, torch.bfloat16).use_decode_gemv(True)
    gpu = ModelRunner(model, 256, 16, cuda_device, cuda_graphs=graphs)
    ids = list(range(batch))
    gen = torch.Generator().manual_seed(batch)
    prompt = torch.randint(0, 2048, (batch, 24), generator=gen).tolist()
    ref.forward(ids, prompt, [0] * batch, last_n=1)
    gpu.forward(ids, prompt, [0] * batch, last_n=1)
    errors = []
    for pos in range(24, 32):
        tok = torch.randint(0, 2048, (batch, 1), generator=gen)
        want = ref.forward(ids, tok.tolist(), [pos] * batch, last_n=1)
        got = gpu.forward_ids(ids, tok.to(cuda_device), [pos] * batch, [1] * batch, last_n=1)
        errors.append(relative(got.cpu().float(), want))
    assert max(errors) < LOGIT_LIMIT[torch.bfloat16], f"relative errors {[f'{e:.2e}' for e in errors]}"


def test_wider_steps_take_the_unfused_path(cuda_device: torch.device) -> None:
    ref = ModelRunner(load_model(TINY_TARGET, "cpu", torch.float32), 64, 16, "cpu")
    model = load_model(TINY_TARGET, cuda_device, torch.bfloat16).use_decode_gemv(True)
    gpu = ModelRunner(model, 64, 16, cuda_device)
    prompt = torch.randint(0, 2048, (2, 20), generator=torch.Generator().manual_seed(1)).tolist()  # 40 tokens
    got = gpu.forward([0, 1], prompt, [0, 0], last_n=20).cpu().float()
    assert relative(got, ref.forward([0, 1], prompt, [0, 0], last_n=20)) < LOGIT_LIMIT[torch.bfloat16]
