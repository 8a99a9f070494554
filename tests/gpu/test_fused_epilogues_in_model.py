"""The model's decoder layers with the fused epilogues chosen (engine/model.py's q/k/v with rotary and KV write,
engine/layers.py's gated gate/up): decode and verify steps whose KV the fused kernel writes and the next steps
read give the logits of the plain-torch path, greedy tokens equal, and the plan records the fused choices."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from minedraft.bundled import TINY_TARGET
from minedraft.engine import blas_plan, layers, runner
from minedraft.engine import model as model_module
from minedraft.engine.blas_ops import rope_op, split_choice
from minedraft.engine.blas_plan import TRITON, BlasPlan
from minedraft.engine.loader import load_model


def favour_fused(choice: str, rows: int, weights: Sequence[torch.Tensor]) -> float:
    """A stand-in timer under which every Triton candidate wins (the kernels' speed is not the point here)."""
    return 0.01 if split_choice(choice)[1].startswith(TRITON) else 1.0


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def test_fused_epilogues_give_the_reference_logits(kernel_device: torch.device,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(TINY_TARGET, kernel_device, torch.bfloat16)
    reference = runner.ModelRunner(model, 128, 16, kernel_device, cuda_graphs=False)
    monkeypatch.setattr(runner, "attention_backend", lambda device: "triton")
    fused = runner.ModelRunner(model, 128, 16, kernel_device, cuda_graphs=False)
    if kernel_device.type == "cpu":  # the reference runs the plain-torch layers
        assert reference.backend == "torch"
    plan = BlasPlan(mode="auto", time_fn=favour_fused, set_fn=lambda library: None,
                    device_types=(kernel_device.type,))
    for module in (blas_plan, layers, model_module):
        monkeypatch.setattr(module, "PLAN", plan)
    torch.manual_seed(0)
    batch, prompt_len = 2, 12
    seqs = list(range(batch))
    prompt = torch.randint(0, 2048, (batch, prompt_len)).tolist()
    for r in (reference, fused):
        r.forward(seqs, prompt, [0] * batch, last_n=1)
    start = prompt_len
    for width in (1, 5, 1, 1):  # decode, a verify window, decodes reading the fused kernel's KV
        ids = torch.randint(0, 2048, (batch, width), device=kernel_device)
        args = (seqs, ids, [start] * batch, [width] * batch)
        want = reference.forward_ids(*args, last_n=width)
        with plan.choosing():
            fused.forward_ids(*args, last_n=width)  # a new shape: noted, run on the library path
            if plan.pending:
                plan.settle()
            got = fused.forward_ids(*args, last_n=width)  # the same positions again, with the choices
        assert relative(got, want) < 3e-2, width
        assert torch.equal(got.argmax(-1), want.argmax(-1)), width
        start += width
    cfg = model.config
    chosen = {(row["rows"], row["op"]): row["library"] for row in plan.table()}
    for rows in (batch, batch * 5):
        assert str(chosen[(rows, "glu")]).startswith(TRITON)
        assert str(chosen[(rows, rope_op(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim))]).startswith(TRITON)
        assert (rows, "linear") in chosen  # o and down stay plain GEMMs
