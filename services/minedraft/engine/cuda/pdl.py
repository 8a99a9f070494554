"""Programmatic dependent launch (Hopper) along a step's chain of kernels.

Inside a CUDA graph a decode step is a few hundred short kernels, each launched only once the one before
it has finished and flushed its writes: every boundary leaves the GPU draining and refilling, about half a
microsecond each, and each weight stream starts cold. With programmatic dependent launch a kernel's
programs may be placed on the multiprocessors while the kernel before it still runs. Each kernel on the
chain (`chain_wait`) first waits for the previous kernel to complete (`griddepcontrol.wait`: its writes
are visible after it) and then lets the next kernel launch; before the wait it may only read what no
earlier kernel writes (a GEMM sends its first weight blocks towards L2 there), and it writes nothing. So
every kernel still sees all earlier kernels' results (each one waited for the one before it before it
finished), and a kernel launched without the attribute, or after one that is not on the chain, simply
waits as usual: the arithmetic and its order do not change, only when programs are placed.

`MINEDRAFT_PDL=1` turns the chain on (compiled kernels on Hopper and later; the interpreter has no such
launch).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from minedraft.engine.cuda.fp8_launch import has_pdl

PDL_ENV = "MINEDRAFT_PDL"


def chained(device: torch.device) -> bool:
    """Whether this device's step kernels launch on the dependent chain."""
    return os.environ.get(PDL_ENV, "0") == "1" and has_pdl(device)


@triton.jit
def chain_wait(PDL: tl.constexpr):
    """Wait for the previous kernel's writes, then let the next kernel's programs be placed."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs):
    """Start these addresses' lines towards L2 (constant data only: it runs before the chain's wait)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [ptrs], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def prefetch_weight_rows(w_ptr, rows, n_rows, stride, K, BLOCKS: tl.constexpr, BLOCK_K: tl.constexpr,
                         LINE: tl.constexpr):
    """Before the chain's wait: the first BLOCKS K blocks of these weight rows towards L2, one address per
    128-byte line (LINE elements)."""
    base = w_ptr + tl.minimum(rows, n_rows - 1).to(tl.int64)[:, None] * stride
    lines = tl.arange(0, BLOCK_K // LINE) * LINE
    for b in tl.static_range(BLOCKS):
        prefetch_l2(base + tl.minimum(b * BLOCK_K + lines, K - 1)[None, :])


@triton.jit
def chain_wait_rows(w_ptr, rows, pair_offset, n_rows, stride, K, PDL: tl.constexpr, PREFETCH: tl.constexpr,
                    BLOCK_K: tl.constexpr, LINE: tl.constexpr, PAIRED: tl.constexpr):
    """A few-row GEMM's entry on the chain: its weight rows' first PREFETCH K blocks (and, PAIRED, those of the
    rows pair_offset further on) towards L2, then the wait."""
    if PREFETCH > 0:
        prefetch_weight_rows(w_ptr, rows, n_rows, stride, K, PREFETCH, BLOCK_K, LINE)
        if PAIRED:
            prefetch_weight_rows(w_ptr, rows + pair_offset, n_rows, stride, K, PREFETCH, BLOCK_K, LINE)
    chain_wait(PDL)


def chain_launch(device: torch.device) -> dict[str, bool]:
    """A kernel's launch arguments for the chain: its PDL switch and the launch attribute, both from one read."""
    on = chained(device)
    return {"PDL": on, "launch_pdl": on}


def gemm_chain_launch(device: torch.device, weight: torch.Tensor) -> dict[str, bool | int]:
    """`chain_launch` plus what a few-row GEMM prefetches before it waits: PREFETCH K blocks of its weight
    (`MINEDRAFT_PDL_PREFETCH`, default 1; 0 off the chain) and LINE, the weight elements of a 128-byte line."""
    on = chained(device)
    blocks = int(os.environ.get("MINEDRAFT_PDL_PREFETCH", "1")) if on else 0
    return {"PDL": on, "launch_pdl": on, "PREFETCH": blocks, "LINE": 128 // weight.element_size()}
