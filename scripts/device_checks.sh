#!/usr/bin/env bash
# Checks the engine on a GPU machine and measures what the engine-step, FP8 and TETRIS pages report,
# inside a deadline: the GPU suite (kernels whose code is unchanged can be skipped), the
# engine-step table in bf16 and FP8 (GPU time, whole time, bound, host phases), then TETRIS against fixed k
# and AR on the synthetic 8B pair. Each stage gets what is left of DEADLINE (seconds, default 540).
# Usage on the device machine, from the repository root (carry `.whl` and `services/minedraft/proto`):
#   bash scripts/device_checks.sh OUTDIR
# SKIP_TESTS="tests/gpu/test_paged_attention_kernels.py ..." leaves those files out of the suite.
set -uo pipefail
OUTDIR="${1:?usage: scripts/device_checks.sh OUTDIR}"
mkdir -p "$OUTDIR"
START=$(date +%s)
DEADLINE="${DEADLINE:-540}"
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
say() { echo "[checks $(( $(date +%s) - START ))s] $*" | tee -a "$OUTDIR/checks.log"; }
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$OUTDIR/checks.log" 2>&1

IGNORE=()
for f in ${SKIP_TESTS:-}; do IGNORE+=(--ignore "$f"); done
T=$(( $(left) - 330 )); (( T > 240 )) && T=240
say "gpu tests: ${T}s"
timeout "$T" python3 -m pytest tests/gpu -q -rs -p no:cacheprovider "${IGNORE[@]}" > "$OUTDIR/gpu_tests.txt" 2>&1
say "gpu tests exit $? (124: out of time)"
grep -E "passed|failed|FAILED|ERROR|SKIPPED" "$OUTDIR/gpu_tests.txt" | tail -15 | tee -a "$OUTDIR/checks.log"

T=$(( $(left) - 150 )); (( T > 200 )) && T=200
say "step table bf16 + fp8: ${T}s"
timeout "$T" python3 -m minedraft.bench.gpu.step_profile --out "$OUTDIR/steps" --weights bf16,fp8 \
  --step-batches 1,16,32,64 --step-ks 4 --step-rounds 3 > "$OUTDIR/steps.log" 2>&1
say "step table exit $?"

T=$(( $(left) - 5 ))
if (( T > 40 )); then
  say "tetris: ${T}s"
  timeout "$T" python3 -m minedraft.bench.tetris_bench --synthetic llama3-8b --agree 0.7 --draft-layers 4 \
    --batches 32,64 --ks 4,6 --extra 3 --steps 12 --num-blocks 8192 --out "$OUTDIR/tetris_bench.json" \
    > "$OUTDIR/tetris_bench.log" 2>&1
  say "tetris exit $?"
  tail -12 "$OUTDIR/tetris_bench.log" | tee -a "$OUTDIR/checks.log"
else
  say "tetris skipped: ${T}s left"
fi
say "done"
