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
from minedraft.engine.fused import silu_and_mul as fused_silu
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

    def plan(self, extra: Sequence[str] = ()) -> BlasPlan:
        return BlasPlan(mode="auto", time_fn=self.time, set_fn=self.set.append, device_types=("cpu",),
                        extra_fn=lambda rows, dtype: extra)


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
    from minedraft.engine.cuda.skinny_gemm import MAX_ROWS

    one, five = triton_choices(1, torch.bfloat16), triton_choices(5, torch.bfloat16)
    assert one and all(skinny_config(c).form == "fma" for c in one)
    assert five and all(skinny_config(c).block_m == 16 for c in five)
    assert all(skinny_config(c).block_m == 64 for c in triton_choices(MAX_ROWS, torch.bfloat16))
    assert triton_choices(MAX_ROWS + 1, torch.bfloat16) == [] and skinny_config("cublas") is None


class GluRecorder(Recorder):
    """The gated op's candidates: `glu:triton:g` 30% faster than cuBLAS + silu*up where `fast_glu`, else every
    candidate within the margin; the plain op as Recorder."""

    def __init__(self, fast_glu: bool) -> None:
        super().__init__()
        self.fast_glu = fast_glu

    def time(self, library: str, rows: int, weights: Sequence[torch.Tensor]) -> float:
        if not library.startswith("glu:"):
            return super().time(library, rows, weights)
        self.timed.append((library, rows, weights[0].shape[0], len(weights)))
        if library == "glu:cublas":
            return 1.0
        return 0.7 if self.fast_glu and library == "glu:triton:g" else 1.0 - MARGIN / 2

    def plan(self, extra: Sequence[str] = ()) -> BlasPlan:
        plan = super().plan(extra)
        plan.glu_extra_fn = lambda rows, dtype: ("triton:g",)
        return plan


def swiglu(inter: int = 6) -> layers.SwiGLU:
    torch.manual_seed(0)
    mlp = layers.SwiGLU(K, inter).to(torch.bfloat16)
    mlp.fuse()
    return mlp


def reference(mlp: layers.SwiGLU, x: torch.Tensor) -> torch.Tensor:
    gate, up = torch.nn.functional.linear(x, mlp.gate_up_weight).chunk(2, dim=-1)  # type: ignore[arg-type]
    return torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, mlp.down_weight)  # type: ignore[arg-type]


@pytest.mark.parametrize("fast_glu", [True, False], ids=["gated-kernel-wins", "library-kept"])
def test_swiglu_plans_gate_up_and_its_activation_as_one_op(fast_glu: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a capture SwiGLU asks the plan for its gated op (never the plain GEMM of the gate/up shape): the
    candidates are timed with the activation (glu: prefix), the gated Triton GEMM runs where it wins, a library's
    GEMM and the silu*up kernel where one is kept; outside a capture the plain path runs."""
    rec = GluRecorder(fast_glu)
    plan = rec.plan(extra=("triton:b",))
    monkeypatch.setattr(layers, "PLAN", plan)
    monkeypatch.setattr(layers, "silu_and_mul", lambda gu, backend: fused_silu(gu, "torch"))  # no CUDA here
    ran: list[tuple[str, bool]] = []

    def kernel(choice: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               glu: bool = False) -> torch.Tensor:
        ran.append((choice, glu))
        assert glu and bias is None
        gate, up = torch.nn.functional.linear(x, weight).chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    monkeypatch.setattr(layers, "triton_linear", kernel)
    mlp = swiglu()
    x = torch.randn(4, K, dtype=torch.bfloat16)
    with plan.choosing():
        first = mlp(x, "triton")  # first warm-up: cuBLAS and the separate activation
        gate_up = (4, 12, K, torch.bfloat16, "glu")
        assert gate_up in plan.pending and (4, 12, K, torch.bfloat16, "linear") not in plan.pending
        plan.settle()
        assert sorted(c for c, _, out, _ in rec.timed if out == 12) == ["glu:cublas", "glu:cublaslt", "glu:triton:g"]
        second = mlp(x, "triton")
    assert ran == ([("triton:g", True)] if fast_glu else [])
    rows = {(r["out"], r["op"]): r for r in plan.table()}
    assert rows[(12, "glu")]["library"] == ("triton:g" if fast_glu else "cublas")
    assert (12, "linear") not in rows and rows[(K, "linear")]["library"] == "cublas"  # the down projection
    torch.testing.assert_close(first, reference(mlp, x))
    torch.testing.assert_close(second, reference(mlp, x))
    ran.clear()
    mlp(x, "triton")  # eager, after the capture
    assert ran == [] and plan.current == "cublas"


def test_the_gated_candidates_are_the_kernels_gated_shortlist() -> None:
    pytest.importorskip("triton")
    from minedraft.engine.blas_plan import skinny_config, triton_choices, triton_glu_choices
    from minedraft.engine.cuda.skinny_gemm import SMEM

    for rows in (1, 16, 20, 64):
        gated = triton_glu_choices(rows, torch.bfloat16)
        assert gated and gated == triton_choices(rows, torch.bfloat16, glu=True)
        assert all(skinny_config(c).staged_bytes(2, glu=True) <= SMEM for c in gated)
    assert triton_glu_choices(65, torch.bfloat16) == []


def test_the_rope_op_is_planned_with_its_geometry_and_timed_as_one_step() -> None:
    """q/k/v with rotary embedding and the KV write is its own op, named with the heads' geometry: its
    candidates are timed under `rope<H>x<Hkv>x<D>:`, the Triton ones offered for that head width, and the choice
    comes back to the caller (a library now set, or the one-kernel config)."""
    from minedraft.engine.blas_ops import rope_geometry, rope_op, split_choice

    rec = GluRecorder(fast_glu=False)
    plan = rec.plan()
    asked: list[tuple[int, int]] = []

    def rope_extra(rows: int, dtype: torch.dtype, head_dim: int) -> tuple[str, ...]:
        asked.append((rows, head_dim))
        return ("triton:r",)

    plan.rope_extra_fn = rope_extra
    times = {"cublas": 1.0, "cublaslt": 1.0, "triton:r": 0.5}
    plan.time_fn = lambda choice, rows, ws: (rec.timed.append((choice, rows, ws[0].shape[0], len(ws))),
                                             times[split_choice(choice)[1]])[1]
    qkv = weights(4 * 8 + 2 * 2 * 8, 2)  # 4 query heads, 2 kv heads of width 8
    x = torch.randn(3, K, dtype=torch.bfloat16)
    with plan.choosing():
        assert [plan.apply_rope(x, w, 4, 2, 8) for w in qkv] == ["cublas", "cublas"]  # first warm-up
        plan.settle()
        assert plan.apply_rope(x, qkv[0], 4, 2, 8) == "triton:r"
    assert asked == [(3, 8)] and rope_op(4, 2, 8) == "rope4x2x8" and rope_geometry("rope4x2x8") == (4, 2, 8)
    assert sorted(c for c, *_ in rec.timed) == ["rope4x2x8:cublas", "rope4x2x8:cublaslt", "rope4x2x8:triton:r"]
    assert all(n == 2 for *_, n in rec.timed)  # over both layers' weights
    assert [r["op"] for r in plan.table()] == ["rope4x2x8"]
    assert split_choice("glu:triton:a") == ("glu", "triton:a") and split_choice("triton:a") == ("linear", "triton:a")
    assert split_choice("cublas") == ("linear", "cublas") and rope_geometry("glu") is None


def test_the_rope_candidates_are_the_tiles_that_divide_half_a_head() -> None:
    pytest.importorskip("triton")
    from minedraft.engine.blas_plan import skinny_config, triton_glu_choices, triton_rope_choices

    for rows in (1, 16, 20, 64):
        wide = triton_rope_choices(rows, torch.bfloat16, 128)
        assert wide and set(wide) <= set(triton_glu_choices(rows, torch.bfloat16))
        assert all(64 % skinny_config(c).block_n == 0 for c in wide)
        narrow = triton_rope_choices(rows, torch.bfloat16, 32)
        assert all(skinny_config(c).block_n <= 16 for c in narrow)
