"""The chunk sums every FP8 GEMM kernel shares (`fp8_gemm.py`, `fp8_direct.py`, `fp8_paired.py`): a chunk's
sums join the program's total or, with `split` programs along K, are written, and the tile's last program to
arrive adds them all in chunk order, so no second launch is needed and the order is the one-program order."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def arrived_last(count, programs_along_k):
    """Count this program in at its tile's counter; true for the one that arrives last. Every program's
    sums are written before its count rises: one thread takes the ticket after the barrier, with release
    and acquire at GPU scope, as CUTLASS's split-K semaphore does. The last one resets the count."""
    tl.debug_barrier()
    arrived = tl.atomic_add(count, 1, sem="acq_rel", scope="gpu")
    return arrived == programs_along_k - 1


@triton.jit
def close_chunk(acc, total, parts, offset, tile_mask, GRID_SPLIT: tl.constexpr):
    """A finished chunk's sums: written at parts + offset for the ordered addition (split along K), or added to
    the program's total; returns the total."""
    if GRID_SPLIT:
        tl.store(parts + offset, acc, mask=tile_mask)
    else:
        total += acc
    return total


@triton.jit
def add_chunk_sums(total, parts, tile_mask, MN, chunks):
    """total plus every chunk's sums (chunk c at parts + c * MN), in chunk order."""
    for c in range(0, chunks):
        total += tl.load(parts + c * MN, mask=tile_mask, other=0.0, cache_modifier=".cg")
    return total
