"""The L2 prefetch kernel behind `engine/l2_prefetch.py`: one `cp.async.bulk.prefetch.L2` per CHUNK bytes (the
memory system fetches; nothing comes back to the multiprocessors), PER instructions per program (Hopper)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 65536  # bytes per prefetch instruction
PER_PROGRAM = 128  # instructions per program (one per thread of four warps)


@triton.jit
def _prefetch_kernel(ptr, nbytes, CHUNK: tl.constexpr, PER: tl.constexpr):
    off = (tl.program_id(0) * PER + tl.arange(0, PER)).to(tl.int64) * CHUNK
    size = tl.where(off < nbytes, tl.minimum(nbytes - off, CHUNK), 0).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptr + off, size], dtype=tl.int32, is_pure=False, pack=1)


def prefetch_l2(tensor: torch.Tensor, nbytes: int) -> None:
    """Ask for the first nbytes (a multiple of 16) of a contiguous tensor, on the current stream."""
    flat = tensor.view(-1).view(torch.uint8)
    programs = triton.cdiv(triton.cdiv(nbytes, CHUNK), PER_PROGRAM)
    _prefetch_kernel[(programs,)](flat, nbytes, CHUNK=CHUNK, PER=PER_PROGRAM, num_warps=4)
