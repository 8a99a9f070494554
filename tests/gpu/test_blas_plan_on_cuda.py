"""--blas auto on a GPU (engine/blas_plan.py): a CUDA graph's capture times cuBLAS and cuBLASLt for each of
its projections at the graph's row count, keeps the choice, and leaves torch's default library behind it;
the graph's logits agree with the eager step's (cuBLAS) within bf16 rounding, decode and verify windows."""

from __future__ import annotations

import pytest
import torch

from minedraft.bundled import TINY_TARGET
from minedraft.engine import blas_plan, layers
from minedraft.engine import model as model_module
from minedraft.engine.blas_ops import rope_op, split_choice
from minedraft.engine.blas_plan import BlasPlan
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner

BATCH = 4  # a bucket: the graph's GEMMs have exactly BATCH x width rows


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def graphed_against_eager(plan: BlasPlan, device: torch.device, monkeypatch: pytest.MonkeyPatch,
                          batch: int = BATCH):  # type: ignore[no-untyped-def]
    """The tiny target's decode, verify (k = 4) and decode steps through CUDA graphs captured under `plan`,
    and each step's relative logit difference from the eager step's."""
    monkeypatch.setattr(blas_plan, "PLAN", plan)
    monkeypatch.setattr(layers, "PLAN", plan)
    monkeypatch.setattr(model_module, "PLAN", plan)
    model = load_model(TINY_TARGET, device, torch.bfloat16)
    graphed = ModelRunner(model, 256, 16, device)
    eager = ModelRunner(model, 256, 16, device, cuda_graphs=False)
    torch.manual_seed(0)
    seqs = list(range(batch))
    prompt = torch.randint(0, 2048, (batch, 24)).tolist()
    for runner in (graphed, eager):
        runner.forward(seqs, prompt, [0] * batch, last_n=1)
    errors = []
    for width, start in ((1, 24), (5, 25), (1, 30)):  # a decode, a verify window of k = 4, a decode
        ids = torch.randint(0, 2048, (batch, width), device=device)
        want = eager.forward_ids(seqs, ids, [start] * batch, [width] * batch, last_n=width)
        got = graphed.forward_ids(seqs, ids, [start] * batch, [width] * batch, last_n=width)
        errors.append(relative(got, want))
    assert graphed.graphs is not None and graphed.graphs.replays == 3
    return model, errors


def test_graph_captures_choose_a_library_per_projection_shape(cuda_device: torch.device,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    plan = BlasPlan(mode="auto")
    model, errors = graphed_against_eager(plan, cuda_device, monkeypatch)
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


@pytest.mark.parametrize("batch", [1, BATCH])
def test_graphs_run_the_triton_gemm_where_the_plan_keeps_it(batch: int, cuda_device: torch.device,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shape's Triton candidates timed for real, then counted 100x faster so the plan keeps one: the
    graphs replay the kernel (one-row forms at batch 1, tensor-core tiles at 4 and 20 rows; SwiGLU's gate/up as
    the gated kernel, its activation in the epilogue; q/k/v with the rotation and the KV write in its epilogue,
    whose cache the next steps read) and their logits agree with the eager cuBLAS step's as
    closely as cuBLAS's own graphs do."""
    def favour_triton(choice: str, rows: int, weights: list[torch.Tensor]) -> float:
        ms = blas_plan.gemm_ms(choice, rows, weights)
        return ms / 100 if split_choice(choice)[1].startswith(blas_plan.TRITON) else ms

    plan = BlasPlan(mode="auto", time_fn=favour_triton)
    model, errors = graphed_against_eager(plan, cuda_device, monkeypatch, batch)
    assert max(errors) < 3e-2, errors
    table = plan.table()
    assert {row["rows"] for row in table} == {batch, batch * 5}
    assert all(str(row["library"]).startswith(blas_plan.TRITON) for row in table), table
    cfg = model.config
    assert {row["op"] for row in table} == {"linear", "glu", rope_op(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)}
    forms = {rows: {blas_plan.skinny_config(str(r["library"])).form for r in table if r["rows"] == rows}
             for rows in (batch, batch * 5)}
    assert forms[batch * 5] <= {"dot", "swap"} and forms[batch] <= ({"fma"} if batch == 1 else {"dot", "swap"})
    assert torch.backends.cuda.preferred_blas_library() == torch._C._BlasBackend.Cublas
