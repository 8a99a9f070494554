#!/usr/bin/env bash
# One device call on one H200 for issue 28 part 1 (the host step off the critical path): the GPU suite, then the
# engine-step profile (GPU time, whole time, host phases per step), so a before/after pair is two calls.
# Usage on the device machine, from the repository root (carry `.whl` and `services/minedraft/proto`):
#   bash scripts/device_host_step.sh [extra step_profile flags, e.g. --step-batches 1,16,32,64 --step-ks 4,6]
# GPU_TESTS=0 skips the suite; TEST_TIMEOUT / BENCH_TIMEOUT bound each part (seconds).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 3; }
export PYTHONPATH="/tmp/site:${SRC:-$PWD/services}:$PWD"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
if [ "${GPU_TESTS:-1}" != "0" ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest tests/gpu -x -q -rs -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests exit $?"; grep -E "passed|failed|error|SKIPPED" "$OUT/gpu_tests.txt" | tail -8
fi
timeout "${BENCH_TIMEOUT:-240}" python3 -m minedraft.bench.gpu.step_profile --out "$OUT/steps" "$@" \
  2>&1 | tee "$OUT/steps.log" | grep -vE "^\[" | tail -80
echo "step profile exit ${PIPESTATUS[0]}"
grep -E "late [1-9]|Error|error" "$OUT/steps.log" | head -10
