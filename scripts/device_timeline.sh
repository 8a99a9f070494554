#!/usr/bin/env bash
# On a GPU machine: the engine step's GPU timeline (kernels by kind, kernel-boundary gaps, the host phase the GPU
# waits on during longer gaps; bench/gpu/step_trace.py), optionally after GPU tests.
# Usage from the repository root (carry `.whl` and `services/minedraft/proto`):
#   bash scripts/device_timeline.sh OUTDIR
# CELLS / FP8_CELLS: the cells (mode:batch[:k], comma separated) in bf16 / FP8 (FP8: none unless given);
# TESTS: GPU test files to run first.
set -uo pipefail
OUTDIR="${1:?usage: scripts/device_timeline.sh OUTDIR}"
mkdir -p "$OUTDIR"
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUTDIR/gpu.txt" 2>&1
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -rs -p no:cacheprovider $TESTS > "$OUTDIR/gpu_tests.txt" 2>&1
  echo "gpu tests exit $?"; tail -3 "$OUTDIR/gpu_tests.txt"
fi
timeout "${TRACE_TIMEOUT:-240}" python3 -m minedraft.bench.gpu.step_trace --out "$OUTDIR/trace" --weights bf16 \
  --cells "${CELLS:-ar:1,ar:16,ar:64,verify:16:4,verify:64:4,draft:1:4,draft:64:4,fused:16:4}" > "$OUTDIR/trace.log" 2>&1
echo "timeline exit $?"; tail -40 "$OUTDIR/trace.log"
if [ -n "${FP8_CELLS:-}" ]; then
  timeout "${TRACE_TIMEOUT:-240}" python3 -m minedraft.bench.gpu.step_trace --out "$OUTDIR/trace_fp8" --weights fp8 \
    --cells "$FP8_CELLS" > "$OUTDIR/trace_fp8.log" 2>&1
  echo "fp8 timeline exit $?"; tail -20 "$OUTDIR/trace_fp8.log"
fi
