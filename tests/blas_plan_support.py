"""Stand-ins for the GPU in the BLAS plan's tests (tests/test_blas_plan.py, tests/test_blas_plan_ops.py): a timer
that records what it was asked and answers fixed times, and bf16 weights of the shapes those tests plan."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minedraft.engine.blas_plan import MARGIN, BlasPlan

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

    def plan(self, extra: Sequence[str] = (), fused: Sequence[str] = ()) -> BlasPlan:
        """A plan timed by this recorder, offering `extra` Triton candidates for plain GEMMs, `fused` for the
        fused ops."""
        return BlasPlan(mode="auto", time_fn=self.time, set_fn=self.set.append, device_types=("cpu",),
                        extra_fn=lambda op, rows, dtype: extra if op == "linear" else fused)


def weights(out: int, layers_: int) -> list[torch.Tensor]:
    return [torch.randn(out, K, dtype=torch.bfloat16) for _ in range(layers_)]
