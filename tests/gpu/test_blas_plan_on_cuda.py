"""--blas auto on a GPU (engine/blas_plan.py): a CUDA graph's capture times cuBLAS and cuBLASLt for each of
its projections at the graph's row count, keeps the choice, and leaves torch's default library behind it;
the graph's logits agree with the eager step's (cuBLAS) within bf16 rounding, decode and verify windows."""

from __future__ import annotations

import pytest
import torch

from minedraft.bundled import TINY_TARGET
from minedraft.engine import blas_plan, layers
from minedraft.engine.blas_plan import BlasPlan
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner

BATCH = 4  # a bucket: the graph's GEMMs have exactly BATCH x width rows


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def test_graph_captures_choose_a_library_per_projection_shape(cuda_device: torch.device,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    plan = BlasPlan(mode="auto")
    monkeypatch.setattr(blas_plan, "PLAN", plan)
    monkeypatch.setattr(layers, "PLAN", plan)
    model = load_model(TINY_TARGET, cuda_device, torch.bfloat16)
    graphed = ModelRunner(model, 256, 16, cuda_device)
    eager = ModelRunner(model, 256, 16, cuda_device, cuda_graphs=False)
    torch.manual_seed(0)
    seqs = list(range(BATCH))
    prompt = torch.randint(0, 2048, (BATCH, 24)).tolist()
    for runner in (graphed, eager):
        runner.forward(seqs, prompt, [0] * BATCH, last_n=1)
    errors = []
    for width, start in ((1, 24), (5, 25), (1, 30)):  # a decode, a verify window of k = 4, a decode
        ids = torch.randint(0, 2048, (BATCH, width), device=cuda_device)
        want = eager.forward_ids(seqs, ids, [start] * BATCH, [width] * BATCH, last_n=width)
        got = graphed.forward_ids(seqs, ids, [start] * BATCH, [width] * BATCH, last_n=width)
        errors.append(relative(got, want))
    assert graphed.graphs is not None and graphed.graphs.replays == 3
    assert max(errors) < 3e-2, errors
    cfg = model.config
    shapes = {(row["out"], row["in"]) for row in plan.table() if row["rows"] == BATCH * 5}
    heads = cfg.num_heads * cfg.head_dim
    kv = 2 * cfg.num_kv_heads * cfg.head_dim
    want = {(heads + kv, cfg.hidden_size), (cfg.hidden_size, heads), (2 * cfg.intermediate_size, cfg.hidden_size),
            (cfg.hidden_size, cfg.intermediate_size), (cfg.vocab_size, cfg.hidden_size)}
    assert shapes == want, plan.table()
    assert {row["rows"] for row in plan.table()} == {BATCH, BATCH * 5}
    assert all(row["cublas_us"] > 0 and row["cublaslt_us"] > 0 for row in plan.table())
    assert not plan.pending and not plan.active
    print("choices:", [(r["rows"], r["out"], r["in"], r["library"]) for r in plan.table()])
    assert torch.backends.cuda.preferred_blas_library() == torch._C._BlasBackend.Cublas
