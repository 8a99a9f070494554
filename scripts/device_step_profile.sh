#!/usr/bin/env bash
# On a GPU machine: the engine-step table (GPU time, whole time, bound, host phases) through
# `minedraft bench gpu --step-only`, optionally after GPU tests.
# Usage on the device machine, from the repository root (carry `.whl` and `services/minedraft/proto`):
#   bash scripts/device_step_profile.sh [extra `minedraft bench gpu` flags]
# TESTS="tests/gpu/test_capture_ahead_on_cuda.py ..." runs those GPU tests first (default: none).
set -uo pipefail
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
source scripts/device_env.sh  # SRC: the tree to run (a snapshot of it may be carried instead)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086
  timeout "${TEST_TIMEOUT:-120}" python3 -m pytest -q -rs -p no:cacheprovider -x $TESTS > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests exit $?"; grep -E "passed|failed|error|SKIPPED" "$OUT/gpu_tests.txt" | tail -5
fi
timeout "${BENCH_TIMEOUT:-200}" python3 -m minedraft.cli.main bench gpu --out "$OUT/steps" --step-only "$@" \
  2>&1 | tee "$OUT/steps.log" | grep -vE "^\[" | tail -80
echo "bench exit ${PIPESTATUS[0]}"
grep -E "late [1-9]|Error|error" "$OUT/steps.log" | head -10
