"""Without a GPU: every Triton kernel of the step, as the interpreter tests launch it (the FP8 ones with pointer and
with tensor-memory-accelerator loads), compiled for Hopper (sm_90)
by Triton and assembled by ptxas with the dependent chain on, and off (`engine/cuda/pdl.py`). The chain's
instructions must be in every chained kernel's code and in none without it, no chained kernel may read or write
global memory before its wait (what the kernel before it wrote is visible only after it), and the few-row and FP8 GEMMs
must send weight lines towards L2 before they wait. On a GPU the kernels compile for real and this skips."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="compiled for the real GPU by the other tests")

ROOT = Path(__file__).resolve().parents[2]
KERNEL_TESTS = ("test_fused_kernels.py", "test_greedy_verdict_kernel.py", "test_skinny_gemm.py", "test_skinny_rope.py",
                "test_paged_attention_kernels.py", "test_fp8_paired.py", "test_fp8_on_cuda.py")
CHAINED = {"fused_kernels._add_rms_norm_kernel", "fused_kernels._rope_store_kernel", "fused_kernels._silu_mul_kernel",
           "greedy_verdict._greedy_verdict_kernel", "skinny_gemm._skinny_fma_kernel", "skinny_gemm._skinny_dot_kernel",
           "skinny_split._skinny_split_kernel", "skinny_rope._skinny_rope_kernel", "paged_attention._write_kv_kernel",
           "paged_attention._paged_attention_kernel", "paged_attention._merge_splits_kernel",
           "fp8_gemm._fp8_gemm_kernel", "fp8_gemm._quant_groups_kernel", "fp8_gemm._quant_rows_kernel",
           "fp8_gemm._sum_chunks_kernel", "fp8_paired._fp8_paired_kernel", "fp8_direct._fp8_direct_kernel",
           "fp8_gemm._fp8_gemm_kernel+tma", "fp8_paired._fp8_paired_kernel+tma", "fp8_direct._fp8_direct_kernel+tma",
           *(f"{k}+channel" for k in ("fp8_gemm._fp8_gemm_kernel", "fp8_gemm._fp8_gemm_kernel+tma",
                                      "fp8_paired._fp8_paired_kernel", "fp8_paired._fp8_paired_kernel+tma",
                                      "fp8_direct._fp8_direct_kernel", "fp8_direct._fp8_direct_kernel+tma"))}
PREFETCHING = {"skinny_gemm._skinny_fma_kernel", "skinny_gemm._skinny_dot_kernel", "skinny_split._skinny_split_kernel",
               "skinny_rope._skinny_rope_kernel", "fp8_gemm._fp8_gemm_kernel", "fp8_gemm._fp8_gemm_kernel+tma",
               "fp8_gemm._fp8_gemm_kernel+channel", "fp8_gemm._fp8_gemm_kernel+tma+channel"}


def test_every_step_kernel_compiles_for_hopper_with_the_chain_on_and_off(tmp_path: Path) -> None:
    launches, facts = tmp_path / "launches.json", tmp_path / "facts.json"
    env = {**os.environ, "MINEDRAFT_LAUNCHES": str(launches)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                          "tests.gpu.launch_recorder", *(f"tests/gpu/{t}" for t in KERNEL_TESTS)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:]
    compiled_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, do not interpret
    run = subprocess.run([sys.executable, "-m", "tests.gpu.launch_recorder", str(launches), "--representatives",
                          "--off-too", "--json", str(facts)], cwd=ROOT, env=compiled_env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    by_chain = {(f["kernel"], f["chain"]): f for f in json.loads(facts.read_text())}
    assert {kernel for kernel, _ in by_chain} == CHAINED
    for kernel in CHAINED:
        on, off = by_chain[(kernel, True)], by_chain[(kernel, False)]
        assert on["waits"] and on["launches_dependents"], kernel
        assert on["touches_before_wait"] == 0, kernel  # no global read or write before the wait
        assert not (off["waits"] or off["launches_dependents"] or off["prefetches"]), kernel
        assert (on["prefetches"] > 0) == (kernel in PREFETCHING), kernel
        assert on["cubin_bytes"] > 0 and off["cubin_bytes"] > 0
