"""The per-shape BLAS choice of CUDA graph captures (engine/blas_plan.py): what it times, keeps and sets.

The libraries themselves need a GPU (tests/gpu/test_blas_plan_on_cuda.py); here the timer and torch's setting
are stand-ins so the bookkeeping is checked exactly: which shapes are timed over which weights, what margin
keeps cuBLASLt, which library each GEMM runs under inside a capture, and that eager work is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from minedraft.engine import layers
from minedraft.engine.blas_plan import MARGIN, PLAN, BlasPlan
from minedraft.worker.settings import BLAS_MODES

K, N_FAST, N_TIE = 8, 16, 24  # in features; a shape cuBLASLt wins, a shape it ties


class Recorder:
    """Stands in for the GPU: cuBLASLt is 10% faster for N_FAST at 4 rows, within the margin elsewhere."""

    def __init__(self) -> None:
        self.timed: list[tuple[str, int, int, int]] = []  # (library, rows, out features, weights)
        self.set: list[str] = []

    def time(self, library: str, rows: int, weights: Sequence[torch.Tensor]) -> float:
        out = weights[0].shape[0]
        self.timed.append((library, rows, out, len(weights)))
        if library == "cublas":
            return 1.0
        return 0.9 if (out, rows) == (N_FAST, 4) else 1.0 - MARGIN / 2

    def plan(self) -> BlasPlan:
        return BlasPlan(mode="auto", time_fn=self.time, set_fn=self.set.append, device_types=("cpu",))


def weights(out: int, layers_: int) -> list[torch.Tensor]:
    return [torch.randn(out, K, dtype=torch.bfloat16) for _ in range(layers_)]


def run_layers(plan: BlasPlan, rows: int, fast: list[torch.Tensor], tie: list[torch.Tensor]) -> list[str]:
    """One 'step': each layer's two GEMMs; returns the library current at each GEMM."""
    x = torch.randn(rows, K, dtype=torch.bfloat16)
    seen = []
    for a, b in zip(fast, tie, strict=True):
        for w in (a, b):
            plan.apply(x, w)
            seen.append(plan.current)
    return seen


def test_a_capture_times_each_new_shape_over_its_layers_and_keeps_the_faster() -> None:
    rec = Recorder()
    plan = rec.plan()
    fast, tie = weights(N_FAST, 3), weights(N_TIE, 3)
    with plan.choosing():
        assert run_layers(plan, 4, fast, tie) == ["cublas"] * 6  # first warm-up: nothing chosen yet
        plan.settle()
        assert sorted(rec.timed) == sorted((lib, 4, n, 3) for lib in ("cublas", "cublaslt") for n in (N_FAST, N_TIE))
        assert run_layers(plan, 4, fast, tie) == ["cublaslt", "cublas"] * 3  # the tie stays with cuBLAS
    assert plan.current == "cublas" and rec.set[-1] == "cublas"  # eager work after the capture: torch's default
    assert plan.table() == [
        {"rows": 4, "out": N_FAST, "in": K, "cublas_us": 1000.0, "cublaslt_us": 900.0, "library": "cublaslt"},
        {"rows": 4, "out": N_TIE, "in": K, "cublas_us": 1000.0, "cublaslt_us": 995.0, "library": "cublas"}]


def test_each_row_count_is_its_own_choice_and_nothing_is_timed_twice() -> None:
    rec = Recorder()
    plan = rec.plan()
    fast, tie = weights(N_FAST, 2), weights(N_TIE, 2)
    for rows in (4, 8, 4):
        with plan.choosing():
            run_layers(plan, rows, fast, tie)
            plan.settle()
            seen = run_layers(plan, rows, fast, tie)
        assert seen == (["cublaslt", "cublas"] if rows == 4 else ["cublas", "cublas"]) * 2
    assert len(rec.timed) == 2 * 2 * 2  # (4 and 8 rows) x two shapes x two libraries: the third capture times none
    three_d = torch.randn(2, 2, K, dtype=torch.bfloat16)  # [B, Q, K] counts as B x Q rows
    with plan.choosing():
        plan.apply(three_d, fast[0])
        assert plan.current == "cublaslt" and not plan.pending


def test_outside_a_capture_and_off_auto_nothing_is_noted_or_set() -> None:
    rec = Recorder()
    plan = rec.plan()
    fast = weights(N_FAST, 1)
    plan.apply(torch.randn(4, K, dtype=torch.bfloat16), fast[0])  # an eager GEMM
    float_weight = torch.randn(N_FAST, K)
    with plan.choosing():
        plan.apply(torch.randn(4, K), float_weight)  # float32 is not for this plan
    assert not plan.pending and not rec.set
    plan.configure("cublaslt")
    assert rec.set == ["cublaslt"]
    with plan.choosing():
        plan.apply(torch.randn(4, K, dtype=torch.bfloat16), fast[0])
    assert not plan.pending and rec.set == ["cublaslt"]  # the whole process runs cuBLASLt: nothing to choose
    with pytest.raises(ValueError, match="--blas must be one of auto, cublas, cublaslt"):
        plan.configure("rocblas")


def test_the_engines_linear_asks_the_plan_inside_a_capture_only(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    plan = rec.plan()
    monkeypatch.setattr(layers, "PLAN", plan)
    weight, x = weights(N_FAST, 1)[0], torch.randn(4, K, dtype=torch.bfloat16)
    layers.linear(x, weight)
    assert not plan.pending
    with plan.choosing():
        out = layers.linear(x, weight)
        assert plan.pending == {(4, N_FAST, K, torch.bfloat16)}
        plan.settle()
        layers.linear(x, weight)
        assert plan.current == "cublaslt"
    torch.testing.assert_close(out, torch.nn.functional.linear(x, weight))
    assert plan.current == "cublas" and PLAN.mode == "auto"  # the process's own plan was not touched


def test_the_workers_flag_offers_the_plans_modes() -> None:
    from minedraft.engine.blas_plan import MODES

    assert BLAS_MODES == MODES
