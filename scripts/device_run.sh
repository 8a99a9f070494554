#!/usr/bin/env bash
# One device call: install the carried wheels, run the GPU tests with pytest, then the GPU sweep.
# Usage on the device machine, from the repository root:
#   bash scripts/device_run.sh [extra `minedraft bench gpu` flags]
# Carry `.whl` (wheels, see docs/benchmarks/gpu.md; pytest's included) and `services/minedraft/proto`
# (generated stubs). SKIP_KERNELS=1 skips the kernel tests (kernels unchanged since their last run);
# MINEDRAFT_KERNEL_CASES sets the random paged-attention cases (default here 40; the tests' own is 150).
# BENCH=placements runs the placement sweep (python -m minedraft.bench.gpu.placement_sweep: AR and SD
# colocated on one GPU against SD-2GPU, PSD and auto through the services) instead of `minedraft bench gpu`.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export MINEDRAFT_KERNEL_CASES="${MINEDRAFT_KERNEL_CASES:-40}"
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 3; }
export PYTHONPATH="/tmp/site:$PWD/services:$PWD"
PYTEST=(python3 -m pytest -rs -p no:cacheprovider)  # pyproject's addopts already has -q
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
if [ -z "${SKIP_KERNELS:-}" ]; then
  timeout 400 "${PYTEST[@]}" tests/gpu/test_paged_attention_kernels.py tests/gpu/test_fused_kernels.py \
    tests/gpu/test_cuda_graph_kernels.py > "$OUT/kernels.txt" 2>&1
  echo "kernel tests exit $?"; grep -E "passed|failed|error" "$OUT/kernels.txt" | tail -3
fi
timeout "${ENGINE_TEST_TIMEOUT:-300}" "${PYTEST[@]}" -s tests/gpu/test_engine_on_cuda.py > "$OUT/engine_check.txt" 2>&1
echo "engine tests exit $?"; grep -E "agreement|passed|failed|error|SKIPPED" "$OUT/engine_check.txt" | tail -8
if [ "${BENCH:-gpu}" = placements ]; then
  python3 -m minedraft.bench.gpu.placement_sweep --out "$OUT/bench" "$@" > "$OUT/bench.log" 2>&1
else
  python3 -m minedraft.cli.main bench gpu --out "$OUT/bench" "$@" > "$OUT/bench.log" 2>&1
fi
echo "bench exit $?"
tail -30 "$OUT/bench.log"
