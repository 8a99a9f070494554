"""The BLAS plan's fused ops (engine/blas_plan.py, engine/blas_ops.py): SwiGLU's gate/up with its activation and
q/k/v with rotary embedding and the KV write are planned as ops of their own, their candidates timed with the
kernels they fold in, and the model runs the choice. Stand-ins for the GPU as in tests/test_blas_plan.py."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from minedraft.engine import layers
from minedraft.engine.blas_plan import MARGIN
from minedraft.engine.fused import silu_and_mul as fused_silu
from tests.blas_plan_support import K, Recorder, weights


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
    plan = rec.plan(extra=("triton:b",), fused=("triton:g",))
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
    from minedraft.engine.blas_plan import TRITON, skinny_config, triton_choices
    from minedraft.engine.cuda.skinny_configs import MAX_ROWS, SMEM, shortlist_for

    for rows in (1, 16, 20, 64, 80):
        gated = triton_choices("glu", rows, torch.bfloat16)
        assert gated and gated == [TRITON + c.name for c in shortlist_for(rows, 2, glu=True)]
        assert all(skinny_config(c).staged_bytes(2, glu=True) <= SMEM for c in gated)
    assert triton_choices("glu", MAX_ROWS + 1, torch.bfloat16) == []


def test_the_rope_op_is_planned_with_its_geometry_and_timed_as_one_step() -> None:
    """q/k/v with rotary embedding and the KV write is its own op, named with the heads' geometry: its
    candidates are timed under `rope<H>x<Hkv>x<D>:`, the Triton ones offered for that head width, and the choice
    comes back to the caller (a library now set, or the one-kernel config)."""
    from minedraft.engine.blas_ops import rope_geometry, rope_op, split_choice

    rec = GluRecorder(fast_glu=False)
    plan = rec.plan()
    asked: list[tuple[str, int]] = []

    def rope_extra(op: str, rows: int, dtype: torch.dtype) -> tuple[str, ...]:
        asked.append((op, rows))
        return ("triton:r",)

    plan.extra_fn = rope_extra
    times = {"cublas": 1.0, "cublaslt": 1.0, "triton:r": 0.5}
    plan.time_fn = lambda choice, rows, ws: (rec.timed.append((choice, rows, ws[0].shape[0], len(ws))),
                                             times[split_choice(choice)[1]])[1]
    qkv = weights(4 * 8 + 2 * 2 * 8, 2)  # 4 query heads, 2 kv heads of width 8
    x = torch.randn(3, K, dtype=torch.bfloat16)
    with plan.choosing():
        assert [plan.apply_rope(x, w, 4, 2, 8) for w in qkv] == ["cublas", "cublas"]  # first warm-up
        plan.settle()
        assert plan.apply_rope(x, qkv[0], 4, 2, 8) == "triton:r"
    assert asked == [("rope4x2x8", 3)] and rope_op(4, 2, 8) == "rope4x2x8" and rope_geometry("rope4x2x8") == (4, 2, 8)
    assert sorted(c for c, *_ in rec.timed) == ["rope4x2x8:cublas", "rope4x2x8:cublaslt", "rope4x2x8:triton:r"]
    assert all(n == 2 for *_, n in rec.timed)  # over both layers' weights
    assert [r["op"] for r in plan.table()] == ["rope4x2x8"]
    assert split_choice("glu:triton:a") == ("glu", "triton:a") and split_choice("triton:a") == ("linear", "triton:a")
    assert split_choice("cublas") == ("linear", "cublas") and rope_geometry("glu") is None


def test_the_rope_candidates_are_the_tiles_that_divide_half_a_head() -> None:
    pytest.importorskip("triton")
    from minedraft.engine.blas_ops import rope_op
    from minedraft.engine.blas_plan import skinny_config, triton_choices

    for rows in (1, 16, 20, 64):
        wide = triton_choices(rope_op(32, 8, 128), rows, torch.bfloat16)
        assert wide and set(wide) <= set(triton_choices("glu", rows, torch.bfloat16))
        assert all(64 % skinny_config(c).block_n == 0 for c in wide)
        narrow = triton_choices(rope_op(8, 8, 32), rows, torch.bfloat16)
        assert all(skinny_config(c).block_n <= 16 for c in narrow)
