#!/usr/bin/env bash
# On a GPU machine: the decode GEMV's tests, its probe against cuBLAS (per projection and in the AR step), and
# the engine step's GPU timeline (kernels by kind, boundary gaps, the host work the GPU waits on), inside a
# deadline (DEADLINE seconds, default 480). Usage from the repository root (carry `.whl` and
# `services/minedraft/proto`):  bash scripts/device_gemv.sh OUTDIR
# CELLS and FP8_CELLS choose the timeline's cells (mode:batch[:k], comma separated); CONFIGS the GEMV
# configurations the probe times per projection, PROBE_ARGS more flags of the probe.
set -uo pipefail
OUTDIR="${1:?usage: scripts/device_gemv.sh OUTDIR}"
mkdir -p "$OUTDIR"
START=$(date +%s)
DEADLINE="${DEADLINE:-480}"
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
say() { echo "[gemv $(( $(date +%s) - START ))s] $*" | tee -a "$OUTDIR/gemv.log"; }
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$OUTDIR/gemv.log" 2>&1

say "gpu tests"
timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_bf16_gemv.py \
  tests/gpu/test_decode_gemv_on_cuda.py tests/gpu/test_fused_kernels.py > "$OUTDIR/gpu_tests.txt" 2>&1
say "gpu tests exit $?"; tail -3 "$OUTDIR/gpu_tests.txt" | tee -a "$OUTDIR/gemv.log"

T=$(( $(left) - 170 )); (( T > 220 )) && T=220
say "gemv probe: ${T}s"
timeout "$T" python3 -m minedraft.bench.gpu.gemv_probe "$OUTDIR/gemv_probe.json" --configs "${CONFIGS:-6}" \
  ${PROBE_ARGS:-} > "$OUTDIR/gemv_probe.log" 2>&1
say "gemv probe exit $?"; grep -vE "^\s*$" "$OUTDIR/gemv_probe.log" | tail -20

T=$(( $(left) - 10 ))
say "timeline: ${T}s"
timeout "$T" python3 -m minedraft.bench.gpu.step_trace --out "$OUTDIR/trace" --weights bf16 \
  --cells "${CELLS:-ar:1,ar:16,ar:64,verify:16:4,verify:64:4,draft:1:4,draft:64:4,fused:16:4}" \
  > "$OUTDIR/trace.log" 2>&1
say "timeline exit $?"; tail -25 "$OUTDIR/trace.log"
if [ -n "${FP8_CELLS:-}" ] && (( $(left) > 40 )); then
  timeout $(( $(left) - 5 )) python3 -m minedraft.bench.gpu.step_trace --out "$OUTDIR/trace_fp8" --weights fp8 \
    --cells "$FP8_CELLS" > "$OUTDIR/trace_fp8.log" 2>&1
  say "fp8 timeline exit $?"; tail -6 "$OUTDIR/trace_fp8.log"
fi
