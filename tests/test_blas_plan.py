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
from tests.blas_plan_support import N_FAST, N_TIE, K, Recorder, weights


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
        {"rows": 4, "out": N_FAST, "in": K, "op": "linear", "cublas_us": 1000.0, "cublaslt_us": 900.0,
         "triton_us": None, "triton": None, "library": "cublaslt"},
        {"rows": 4, "out": N_TIE, "in": K, "op": "linear", "cublas_us": 1000.0, "cublaslt_us": 995.0,
         "triton_us": None, "triton": None, "library": "cublas"}]


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
        assert plan.pending == {(4, N_FAST, K, torch.bfloat16, "linear")}
        plan.settle()
        layers.linear(x, weight)
        assert plan.current == "cublaslt"
    torch.testing.assert_close(out, torch.nn.functional.linear(x, weight))
    assert plan.current == "cublas" and PLAN.mode == "auto"  # the process's own plan was not touched


def test_the_workers_flag_offers_the_plans_modes() -> None:
    from minedraft.engine.blas_plan import MODES

    assert BLAS_MODES == MODES


class TritonRecorder(Recorder):
    """As Recorder, with two Triton configs: `triton:b` 20% faster than cuBLAS for N_TIE, `triton:a` within
    the margin everywhere."""

    def time(self, library: str, rows: int, weights: Sequence[torch.Tensor]) -> float:
        if not library.startswith("triton:"):
            return super().time(library, rows, weights)
        self.timed.append((library, rows, weights[0].shape[0], len(weights)))
        return 0.8 if (library, weights[0].shape[0]) == ("triton:b", N_TIE) else 1.0 - MARGIN / 2


def test_a_triton_config_is_kept_where_it_beats_cublas_by_the_margin() -> None:
    rec = TritonRecorder()
    plan = rec.plan(extra=("triton:a", "triton:b"))
    fast, tie = weights(N_FAST, 2), weights(N_TIE, 2)
    x = torch.randn(4, K, dtype=torch.bfloat16)
    with plan.choosing():
        assert plan.apply(x, fast[0]) is None and plan.apply(x, tie[0]) is None  # nothing chosen yet
        plan.settle()
        assert sorted(rec.timed) == sorted((c, 4, n, 1) for c in ("cublas", "cublaslt", "triton:a", "triton:b")
                                           for n in (N_FAST, N_TIE))
        rec.set.clear()
        assert plan.apply(x, fast[0]) is None and plan.current == "cublaslt"
        assert plan.apply(x, tie[0]) == "triton:b"  # the caller runs the kernel; the library is left as it is
        assert plan.current == "cublaslt" and rec.set == ["cublaslt"]
        assert plan.apply(x, tie[0].t().contiguous().t()) is None  # a strided weight of the shape: cuBLAS
        assert plan.current == "cublas"
    rows = {r["out"]: r for r in plan.table()}
    assert rows[N_TIE]["library"] == "triton:b" and rows[N_TIE]["triton"] == "b" and rows[N_TIE]["triton_us"] == 800.0
    assert rows[N_FAST]["library"] == "cublaslt" and rows[N_FAST]["triton_us"] == 995.0


def test_the_engines_linear_runs_a_triton_choice_through_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = TritonRecorder()
    plan = rec.plan(extra=("triton:b",))
    monkeypatch.setattr(layers, "PLAN", plan)
    ran = []

    def kernel(choice: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ran.append(choice)
        return torch.nn.functional.linear(x, weight, bias) + 1.0

    monkeypatch.setattr(layers, "triton_linear", kernel)
    weight, x = weights(N_TIE, 1)[0], torch.randn(4, K, dtype=torch.bfloat16)
    with plan.choosing():
        layers.linear(x, weight)
        plan.settle()
        got = layers.linear(x, weight)
    assert ran == ["triton:b"]
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight) + 1.0)
    assert layers.linear(x, weight).equal(torch.nn.functional.linear(x, weight))  # eager: F.linear


def test_the_triton_candidates_are_the_kernels_shortlist() -> None:
    pytest.importorskip("triton")
    from minedraft.engine.blas_plan import skinny_config, triton_choices
    from minedraft.engine.cuda.skinny_configs import MAX_ROWS

    one, five = triton_choices("linear", 1, torch.bfloat16), triton_choices("linear", 5, torch.bfloat16)
    assert one and all(skinny_config(c).form == "fma" for c in one)
    assert five and all(skinny_config(c).block_m == 16 for c in five)
    assert all(skinny_config(c).block_m == 64 for c in triton_choices("linear", 64, torch.bfloat16))
    assert all(skinny_config(c).block_m == MAX_ROWS for c in triton_choices("linear", 80, torch.bfloat16))
    assert triton_choices("linear", MAX_ROWS + 1, torch.bfloat16) == [] and skinny_config("cublas") is None
