"""The operations the BLAS plan chooses kernels for, and what a timed candidate of each runs.

- `linear`: y = x W^T.
- `glu`: SwiGLU's gate/up projection with its activation, silu(gate) * up.
- `rope<H>x<Hkv>x<D>`: the fused q/k/v projection with rotary embedding and the KV-cache write, for H query
  heads, Hkv kv heads of width D (the op names the geometry the kernel needs).

A candidate is a library (`cublas`, `cublaslt`: its GEMM, then the op's separate kernel) or `triton:<config>`
(the few-row Triton GEMM's form for the op, one kernel). The plan hands the timer `<op>:<candidate>` for
every op but `linear`, so a timing replays exactly what a step would run for that choice.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from minedraft.engine.cuda.skinny_configs import SkinnyConfig

LINEAR, GLU_OP = "linear", "glu"
TRITON = "triton:"  # prefix of a choice that runs the few-row Triton GEMM with the named config
_ROPE = re.compile(r"rope(\d+)x(\d+)x(\d+)")
TIMING_BLOCK = 16  # the timing cache's block size (the kernels' speed does not depend on it)

Gemm = Callable[[torch.Tensor, torch.Tensor], object]


def skinny_config(choice: str) -> SkinnyConfig | None:
    """The Triton config a `triton:<name>` choice names; None for a BLAS library."""
    if not choice.startswith(TRITON):
        return None
    from minedraft.engine.cuda.skinny_configs import BY_NAME

    return BY_NAME[choice[len(TRITON):]]


def rope_op(heads: int, kv_heads: int, head_dim: int) -> str:
    return f"rope{heads}x{kv_heads}x{head_dim}"


def rope_geometry(op: str) -> tuple[int, int, int] | None:
    """(H, Hkv, D) of a rope op; None for another op."""
    match = _ROPE.fullmatch(op)
    return None if match is None else (int(match[1]), int(match[2]), int(match[3]))


def split_choice(timed: str) -> tuple[str, str]:
    """`<op>:<candidate>` -> (op, candidate); a bare candidate is the linear op's."""
    head, sep, rest = timed.partition(":")
    if sep and (head == GLU_OP or rope_geometry(head) is not None):
        return head, rest
    return LINEAR, timed


def prefix(op: str) -> str:
    """What the plan puts before a candidate's name when it asks the timer for this op."""
    return "" if op == LINEAR else op + ":"


def timed_gemm(op: str, candidate: str, rows: int, weight: torch.Tensor) -> Gemm:
    """One step's work for `op` under `candidate`, as a function of (x, weight), with the inputs beside x that
    the op needs (rotary tables, slots, a KV cache) made here for `rows` tokens. A library candidate sets
    torch's library first."""
    config = skinny_config(candidate)
    if config is None:
        torch.backends.cuda.preferred_blas_library(candidate)
    if op == GLU_OP:
        from minedraft.engine.cuda.fused_kernels import silu_mul_triton
        from minedraft.engine.cuda.skinny_gemm import skinny_linear

        if config is None:
            return lambda x, w: silu_mul_triton(F.linear(x, w))
        return lambda x, w: skinny_linear(x, w, None, config, glu=True)
    geometry = rope_geometry(op)
    if geometry is not None:
        return _rope_gemm(geometry, config, rows, weight)
    if config is None:
        return F.linear
    from minedraft.engine.cuda.skinny_gemm import skinny_linear

    return lambda x, w: skinny_linear(x, w, None, config)


def _rope_gemm(geometry: tuple[int, int, int], config: SkinnyConfig | None, rows: int, weight: torch.Tensor) -> Gemm:
    from minedraft.engine.cuda.fused_kernels import rope_store_triton
    from minedraft.engine.cuda.skinny_rope import skinny_qkv_rope

    heads, kv_heads, head_dim = geometry
    device, dtype = weight.device, weight.dtype
    angles = torch.rand(rows, head_dim // 2, device=device) * 1000.0
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().view(1, rows, 1, head_dim), emb.sin().view(1, rows, 1, head_dim)
    blocks = -(-rows // TIMING_BLOCK)
    k_cache = torch.zeros(blocks, TIMING_BLOCK, kv_heads, head_dim, device=device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.arange(rows, device=device)
    if config is None:
        def two_kernels(x: torch.Tensor, w: torch.Tensor) -> object:
            qkv = F.linear(x, w).view(1, rows, -1)
            return rope_store_triton(qkv, cos, sin, slots, k_cache, v_cache, heads, kv_heads, head_dim)
        return two_kernels

    def one_kernel(x: torch.Tensor, w: torch.Tensor) -> object:
        return skinny_qkv_rope(x.view(1, rows, -1), w, None, config, (cos, sin), slots, (k_cache, v_cache),
                               heads, kv_heads, head_dim)
    return one_kernel
