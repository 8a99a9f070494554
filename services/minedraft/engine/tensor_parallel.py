"""Tensor parallelism for the target: Megatron-style column/row sharding over N ranks.

q/k/v, gate and up projections are column-parallel (each rank owns a slice of the heads
and of the MLP's intermediate features); o_proj and down_proj are row-parallel and their
partial outputs are summed with one all-reduce each per layer. Embedding, norms and the
LM head are replicated. Each rank's KV cache holds only its own kv heads. Weights load
straight from safetensors as slices (`safe_open(...).get_slice`), so no rank ever reads
another rank's shard.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from minedraft.core.errors import ModelLoadError
from minedraft.engine.config import ModelConfig

# Checkpoint tensor name suffix -> dimension it is split along (0: output rows, 1: input columns).
COLUMN_PARALLEL = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias", "k_proj.bias",
                   "v_proj.bias", "gate_proj.weight", "up_proj.weight")
ROW_PARALLEL = ("o_proj.weight", "down_proj.weight")
FP8_SCALES = (".weight_scale_inv", ".weight_scale")  # FP8 weight scales shard with their weight (engine/fp8_config.py)


@dataclass(frozen=True, slots=True)
class TPContext:
    """This process's place in the tensor-parallel group."""

    rank: int = 0
    size: int = 1
    group: object | None = None  # a ProcessGroup or a bare c10d backend (ProcessGroupGloo / ProcessGroupNCCL)

    def reducer(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """Sum partial outputs of row-parallel layers across ranks (identity without TP)."""
        if self.size == 1 or self.group is None:
            return lambda x: x
        group = self.group
        opts = dist.AllreduceOptions()
        # Synchronous: NCCL runs it on the current stream. An asynchronous collective runs on the process
        # group's own stream, joined to the compute stream by two events, so a captured step became a
        # graph that forks and joins at every all-reduce (64 times for 32 layers) instead of one line.
        opts.asyncOp = os.environ.get("MINEDRAFT_TP_ALLREDUCE_STREAM", "current") == "side"

        def all_reduce(x: torch.Tensor) -> torch.Tensor:
            work = group.allreduce([x], opts)  # type: ignore[attr-defined]
            if work is not None:  # NCCL returns no Work for a synchronous collective; gloo does
                work.wait()
            return x

        return all_reduce


def local_config(cfg: ModelConfig, tp: TPContext) -> ModelConfig:
    """The per-rank shapes: a 1/size share of heads, kv heads and MLP features."""
    if tp.size == 1:
        return cfg
    for name, value in (("num_attention_heads", cfg.num_heads), ("num_key_value_heads", cfg.num_kv_heads),
                        ("intermediate_size", cfg.intermediate_size)):
        if value % tp.size:
            raise ModelLoadError(f"{name} ({value}) is not divisible by the tensor-parallel size {tp.size}")
    if cfg.quantization is not None and cfg.quantization.scheme == "block":
        _check_fp8_blocks(cfg, tp)
    return replace(cfg, num_heads=cfg.num_heads // tp.size, num_kv_heads=cfg.num_kv_heads // tp.size,
                   intermediate_size=cfg.intermediate_size // tp.size)


def _check_fp8_blocks(cfg: ModelConfig, tp: TPContext) -> None:
    """Each rank's slice of a block-quantized weight must be whole 128x128 blocks, or its scales
    would not split with it (the sharded out-dims of q/k/v and gate/up, the in-dims of o/down)."""
    block = 128
    for name, full in (("num_attention_heads * head_dim", cfg.num_heads * cfg.head_dim),
                       ("num_key_value_heads * head_dim", cfg.num_kv_heads * cfg.head_dim),
                       ("intermediate_size", cfg.intermediate_size)):
        if (full // tp.size) % block:
            raise ModelLoadError(f"FP8 block weights cannot be split {tp.size} ways: {name} ({full}) / {tp.size} "
                                 f"is not a multiple of the {block}-wide scale blocks; use a smaller tensor-parallel "
                                 "size or a per-channel FP8 checkpoint")


def shard_dim(name: str) -> int | None:
    for suffix in FP8_SCALES:
        if name.endswith(suffix):
            return shard_dim(name[: -len(suffix)] + ".weight")
    if name.endswith(COLUMN_PARALLEL):
        return 0
    if name.endswith(ROW_PARALLEL):
        return 1
    return None


def shard_bounds(full: int, tp: TPContext) -> tuple[int, int]:
    part = full // tp.size
    return tp.rank * part, (tp.rank + 1) * part


def take_shard(tensor: torch.Tensor, name: str, tp: TPContext) -> torch.Tensor:
    """This rank's slice of a full tensor (for weights that are generated, not loaded)."""
    dim = shard_dim(name)
    if tp.size == 1 or dim is None:
        return tensor
    lo, hi = shard_bounds(tensor.shape[dim], tp)
    return tensor.narrow(dim, lo, hi - lo)


def read_shard(handle, name: str, tp: TPContext) -> torch.Tensor:
    """Read only this rank's slice of a checkpoint tensor."""
    dim = shard_dim(name)
    if tp.size == 1 or dim is None:
        return handle.get_tensor(name)
    view = handle.get_slice(name)
    if view.get_shape()[dim] == 1:  # a per-channel FP8 scale of a row-parallel weight: every rank needs it
        return handle.get_tensor(name)
    lo, hi = shard_bounds(view.get_shape()[dim], tp)
    return view[lo:hi] if dim == 0 else view[:, lo:hi]
