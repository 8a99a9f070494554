"""Prefix caching and chunked prefill on the CUDA path (Triton attention over attached and chunked KV, CUDA
graphs for the steps after): the bundled tiny target's greedy tokens from a cached prefix and from chunks
match one whole prefill, and the first decode's logits agree within the dtype's tolerance. CI has no GPU;
scripts/device_prefix.sh runs these on one."""

from __future__ import annotations

import pytest
import torch

from minedraft.bundled import TINY_TARGET
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier
from minedraft.proto import control_pb2
from minedraft.worker.membership import apply_membership

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
BS = 16
PROMPT = [(37 * i) % 1900 + 60 for i in range(333)]
LOGIT_LIMIT = {torch.float32: 2e-3, torch.bfloat16: 3e-2}


def spec(seq_id: int, tokens: list[int], cache: bool) -> control_pb2.SeqSpec:
    return control_pb2.SeqSpec(seq_id=seq_id, tokens=tokens, prompt_len=len(tokens), prefix_cache=cache,
                               sampling=control_pb2.SeqSampling())


def decode(worker: Verifier, seq_id: int, steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens, and the logits of the first step's last position."""
    st = worker.seqs[seq_id]
    feed = st.uncached()
    first = worker.runner.forward([seq_id], [feed], [st.cached], last_n=1)[0, -1].float().cpu()
    worker.runner.truncate(seq_id, st.cached)  # the verify below feeds the same tokens again
    out = []
    for _ in range(steps):
        rows, _ = worker.commit([seq_id], worker.read_back(worker.judge([seq_id], None)))
        out.append(rows[0][0])
    return out, first


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cached_and_chunked_prompts_decode_as_one_whole_prefill(dtype: torch.dtype) -> None:
    model = load_model(TINY_TARGET, "cuda:0", dtype)
    worker = Verifier(ModelRunner(model, 256, BS, "cuda:0"))
    apply_membership(worker, control_pb2.StepPlan(step=0, add=[spec(1, PROMPT, cache=True)]))
    whole, whole_logits = decode(worker, 1, 24)
    apply_membership(worker, control_pb2.StepPlan(step=1, remove=[1], add=[spec(2, PROMPT, cache=True)]))
    assert worker.seqs[2].cached == ((len(PROMPT) - 1) // BS) * BS
    cached, cached_logits = decode(worker, 2, 24)
    apply_membership(worker, control_pb2.StepPlan(step=2, remove=[2], add=[spec(3, PROMPT, cache=False)]))
    for step, end in enumerate(range(64, len(PROMPT) + 63, 64)):
        plan = control_pb2.StepPlan(step=3 + step, prefill=[control_pb2.PrefillChunk(seq_id=3, end=end)])
        apply_membership(worker, plan)
    assert worker.seqs[3].cached == len(PROMPT) - 1
    chunked, chunked_logits = decode(worker, 3, 24)
    for logits in (cached_logits, chunked_logits):
        assert float((logits - whole_logits).norm() / whole_logits.norm()) < LOGIT_LIMIT[dtype]
    agree = sum(a == b for a, b in zip(whole, cached, strict=True)) / len(whole)
    agree_chunked = sum(a == b for a, b in zip(whole, chunked, strict=True)) / len(whole)
    assert min(agree, agree_chunked) >= 0.9 if dtype == torch.bfloat16 else cached == whole == chunked
    apply_membership(worker, control_pb2.StepPlan(step=99, remove=[3]))
    assert worker.runner.allocator.num_free == 256
