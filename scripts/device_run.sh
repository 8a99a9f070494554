#!/usr/bin/env bash
# One device call: install the carried wheels, check kernels and engine, run the GPU sweep.
# Usage on the device machine, from the repository root:
#   bash scripts/device_run.sh [extra bench_gpu.py flags]
# Carry `.whl` (wheels, see docs/benchmarks/gpu.md) and `services/minedraft/proto` (generated stubs).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 3; }
export PYTHONPATH="/tmp/site:$PWD/services"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
if [ -z "${SKIP_KERNELS:-}" ]; then  # SKIP_KERNELS=1: the kernels are unchanged since their last check
  timeout 400 python3 scripts/check_cuda_kernels.py --device cuda --no-bench > "$OUT/kernels.txt" 2>&1
  grep -c PASS "$OUT/kernels.txt"; grep FAIL "$OUT/kernels.txt" | head -5; tail -22 "$OUT/kernels.txt"
fi
timeout 300 python3 scripts/check_gpu_engine.py > "$OUT/engine_check.txt" 2>&1
tail -8 "$OUT/engine_check.txt"
python3 scripts/bench_gpu.py --out "$OUT/bench" "$@" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
tail -30 "$OUT/bench.log"
