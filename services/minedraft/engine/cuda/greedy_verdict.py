"""The greedy verdict in one Triton kernel: accepted drafts and emitted tokens per row from the argmax.

With every row greedy, a verify's verdict is the target's argmax row cut after the first slot where the
draft disagrees (engine/rejection.py). In torch that is about ten small launches (compare, cumulative
product, sum, masks, the packing for the readback), each costing host time in line with the step; this
kernel makes it one, writing the packed row the readback copies (accepted count, then the k+1 slots,
-1 past the emitted tokens) and the counts. One program per sequence; no host synchronisation, so it is
safe inside CUDA graph capture.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minedraft.engine.cuda.paged_attention import _INTERPRET  # noqa: F401  (applies the interpreter shim)
from minedraft.engine.cuda.pdl import chain_launch, chain_wait


@triton.jit
def _greedy_verdict_kernel(argmax_ptr, drafts_ptr, lengths_ptr, packed_ptr, counts_ptr, k,
                           HAS_LENGTHS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    chain_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    slot = tl.arange(0, BLOCK)
    target = tl.load(argmax_ptr + row * (k + 1) + slot, mask=slot < k + 1, other=-1)
    draft = tl.load(drafts_ptr + row * k + slot, mask=slot < k, other=-1)
    agree = (draft == target) & (slot < k)
    if HAS_LENGTHS:  # a ragged row verifies only its first lengths[row] drafts
        agree = agree & (slot < tl.load(lengths_ptr + row))
    accepted = tl.min(tl.where(agree, BLOCK, slot), axis=0)  # the first disagreeing slot: k at most
    tokens = tl.where(slot <= accepted, target, -1)
    tl.store(packed_ptr + row * (k + 2) + 1 + slot, tokens, mask=slot < k + 1)
    tl.store(packed_ptr + row * (k + 2), accepted.to(tl.int64))
    tl.store(counts_ptr + row, (accepted + 1).to(tl.int64))


def greedy_verdict_triton(target_argmax: torch.Tensor, drafts: torch.Tensor, lengths: torch.Tensor | None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """packed [B, k+2] (accepted, then the k+1 slots with -1 past the emitted tokens) and counts [B], from the
    target's argmax [B, k+1] and the drafts [B, k] (lengths [B]: drafts each row verified; None: all k)."""
    batch, k = drafts.shape
    packed = torch.empty((batch, k + 2), dtype=torch.long, device=drafts.device)
    counts = torch.empty(batch, dtype=torch.long, device=drafts.device)
    if batch:
        argmax = target_argmax.to(torch.long).contiguous()
        drafts = drafts.to(torch.long).contiguous() if k else argmax  # k = 0: never read, but a valid pointer
        lengths_arg = lengths.to(torch.long).contiguous() if lengths is not None else counts
        _greedy_verdict_kernel[(batch,)](argmax, drafts, lengths_arg, packed, counts, k,
                                         HAS_LENGTHS=lengths is not None,
                                         BLOCK=triton.next_power_of_2(k + 1), **chain_launch(drafts.device))
    return packed, counts
