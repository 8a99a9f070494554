"""The model pairs a sweep level runs: a synthetic pair at some alpha, or the bundled tiny pair."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minedraft.bench.synthetic_pair import SyntheticSpec, load_synthetic
from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft.engine.loader import load_model
from minedraft.engine.model import CausalLM

TINY_ALPHA = -1.0  # how results record the bundled pair (its acceptance is what it is)
SYNTHETIC_WORKERS = "minedraft.bench.synthetic_workers"


@dataclass(frozen=True, slots=True)
class BenchPair:
    alpha: float
    target: str  # a model folder, or a synthetic spec
    draft: str

    @property
    def synthetic(self) -> bool:
        return self.alpha >= 0

    @property
    def worker_module(self) -> str:
        """What the local stack runs its verifier and draft service with."""
        return SYNTHETIC_WORKERS if self.synthetic else "minedraft.cli.main"

    def load(self, model: str, device: str = "cuda:0", dtype: torch.dtype = torch.bfloat16) -> CausalLM:
        return (load_synthetic if self.synthetic else load_model)(model, device, dtype)


def bench_pair(shape: str, draft_layers: int, alpha: float) -> BenchPair:
    """The synthetic `shape` pair at `alpha`; alpha < 0 stands for the bundled tiny pair."""
    if alpha < 0:
        return BenchPair(alpha, str(TINY_TARGET), str(TINY_DRAFT))
    target, draft = SyntheticSpec(shape, "target", alpha, draft_layers).pair()
    return BenchPair(alpha, str(target), str(draft))
