"""The step's kernels on the programmatic dependent chain (engine/cuda/pdl.py, `MINEDRAFT_PDL=1`): each kernel
waits for the one before it, so the chain moves only when programs are placed, never a result. Decode and
verify steps through CUDA graphs give the same logits bit for bit with the chain on and off, in bf16 with the
few-row Triton GEMMs and their fused epilogues in the graphs, and with FP8 weights; a decode that reads the KV
a chained step wrote included. Needs Hopper (the launch attribute); elsewhere the chain is off by itself."""

from __future__ import annotations

import pytest
import torch

from minedraft.bundled import TINY_TARGET
from minedraft.engine import blas_plan, layers
from minedraft.engine import model as model_module
from minedraft.engine.blas_ops import split_choice
from minedraft.engine.blas_plan import BlasPlan
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner

BATCH = 4


def favour_triton(choice: str, rows: int, weights: list[torch.Tensor]) -> float:
    """A stand-in timer under which every Triton candidate wins, so the graphs hold the few-row kernels."""
    return 0.01 if split_choice(choice)[1].startswith(blas_plan.TRITON) else 1.0


def graphed_steps(model: torch.nn.Module, device: torch.device, batch: int) -> list[torch.Tensor]:
    """A prefill, then a decode, a verify window of k = 4 and two decodes through CUDA graphs: each step's logits."""
    runner = ModelRunner(model, 256, 16, device)
    gen = torch.Generator().manual_seed(0)
    seqs = list(range(batch))
    prompt = torch.randint(0, 2048, (batch, 24), generator=gen).tolist()
    out = [runner.forward(seqs, prompt, [0] * batch, last_n=1)]
    start = 24
    for width in (1, 5, 1, 1):
        ids = torch.randint(0, 2048, (batch, width), generator=gen).to(device)
        out.append(runner.forward_ids(seqs, ids, [start] * batch, [width] * batch, last_n=width))
        start += width
    assert runner.graphs is not None and runner.graphs.replays >= 4
    return out


@pytest.mark.parametrize("batch", [1, BATCH])
@pytest.mark.parametrize("weights", ["bf16", "fp8"])
def test_the_chain_changes_no_bit_of_a_step(batch: int, weights: str, cuda_device: torch.device,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from minedraft.bench.fp8_quantizer import quantize_model
    from minedraft.engine.cuda.fp8_launch import has_pdl
    from minedraft.engine.cuda.pdl import PDL_ENV, chained

    if not has_pdl(cuda_device):
        pytest.skip("programmatic dependent launch needs Hopper or later")
    plan = BlasPlan(mode="auto", time_fn=favour_triton, set_fn=lambda library: None)
    for module in (blas_plan, layers, model_module):
        monkeypatch.setattr(module, "PLAN", plan)
    model = load_model(TINY_TARGET, cuda_device, torch.bfloat16)
    if weights == "fp8":
        model = quantize_model(model, "block")
    logits = {}
    for on in ("1", "0"):
        monkeypatch.setenv(PDL_ENV, on)
        assert chained(cuda_device) == (on == "1")
        logits[on] = graphed_steps(model, cuda_device, batch)
    for step, (got, want) in enumerate(zip(logits["1"], logits["0"], strict=True)):
        assert torch.equal(got, want), (weights, batch, step, float((got - want).abs().max()))
    if weights == "bf16":
        assert any(row["library"].startswith(blas_plan.TRITON) for row in plan.table()), plan.table()


def test_the_chain_is_off_without_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU (the interpreter) the setting is ignored: no kernel is compiled with the chain's wait."""
    from minedraft.engine.cuda.pdl import PDL_ENV, chain_launch, chained, gemm_chain_launch

    monkeypatch.setenv(PDL_ENV, "1")
    cpu = torch.device("cpu")
    assert not chained(cpu)
    assert chain_launch(cpu) == {"PDL": False, "launch_pdl": False}
    weight = torch.zeros(4, 4, dtype=torch.bfloat16)
    assert gemm_chain_launch(cpu, weight) == {"PDL": False, "launch_pdl": False, "PREFETCH": 0, "LINE": 64}
