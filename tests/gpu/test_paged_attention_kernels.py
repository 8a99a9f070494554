"""The Triton paged-attention and KV-write kernels against the plain-torch reference (kernel_cases.py).

A case passes when every valid output element was written, padding tokens are zero, the cache
matches the reference write bit for bit, and ||out - ref|| / ||ref|| over valid tokens is below
1e-3 (fp32) or 2e-2 (bf16).
"""

from __future__ import annotations

import zlib

import torch

from tests.gpu.kernel_cases import TOLERANCE, Case, run_case


def test_paged_attention_and_kv_write_match_reference(kernel_case: Case, kernel_device: torch.device) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(kernel_case.label().encode()))
    outcome = run_case(kernel_case, kernel_device, gen)
    assert outcome.cache_ok, "the Triton KV write differs from attention.write_kv"
    assert outcome.written, "some valid output elements were never written (NaN left)"
    assert outcome.pad_zero, "padding query tokens are not zero"
    assert outcome.rel_err < TOLERANCE[kernel_case.dtype], f"relative error {outcome.rel_err:.2e}"
