#!/usr/bin/env bash
# On a GPU machine: what the dependent chain (engine/cuda/pdl.py) must pass before it runs by default, and what it
# gains on this card, inside a deadline. First the GPU suite with MINEDRAFT_PDL=1, the exactness files first
# (FP8 SD against AR, the engine's logits and SD against AR, the chain's own tests, the few-row GEMM and rope
# against the separate kernels, the Hopper compile check), each test's verdict written as it finishes; then the
# rest of tests/gpu. Then the step table with the chain on and off in separate processes (bf16 and FP8, AR and
# the k = 4 verify at batch 1, 16 and 64). Each stage gets what is left of DEADLINE (seconds, default 560).
# Usage on the device machine, from the repository root (carry `.whl` and `services/minedraft/proto`):
#   bash scripts/device_chain.sh OUTDIR
# STAGES (default "key,rest,steps") picks stages; SPLIT=1 first times the 128-row K-split tiles at 80 rows
# against both BLAS libraries (bench/gpu/skinny_sweep.py --configs), TRACE=1 the verify's GPU timeline
# (bench/gpu/step_trace.py). At the end OUTDIR is packed into one file, its logs left beside it.
set -uo pipefail
OUTDIR="${1:?usage: scripts/device_chain.sh OUTDIR}"
mkdir -p "$OUTDIR"
START=$(date +%s)
DEADLINE="${DEADLINE:-560}"
STAGES=",${STAGES:-key,rest,steps},"
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
say() { echo "[chain $(( $(date +%s) - START ))s] $*" | tee -a "$OUTDIR/chain.log"; }
budget() { local t=$(( $(left) - $1 )); (( t > $2 )) && t=$2; echo "$t"; }
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$OUTDIR/chain.log" 2>&1
PYTEST=(python3 -m pytest -v -rfEs -p no:cacheprovider)
KEY=(tests/gpu/test_fp8_on_cuda.py tests/gpu/test_engine_on_cuda.py tests/gpu/test_pdl_chain.py
     tests/gpu/test_skinny_gemm.py tests/gpu/test_skinny_rope.py tests/gpu/test_hopper_compile.py)

if [ "${SPLIT:-0}" = 1 ]; then
  T=$(budget 300 150); say "128-row K-split tiles at 80 rows: ${T}s"
  timeout "$T" python3 -m minedraft.bench.gpu.skinny_sweep --ms 80 --shapes qkv,o,down,qkv+rope \
    --configs swap128x64x128w4s3,swap128x64x64w4s4,dot128x32x128w8s3 --out "$OUTDIR/split80.json" \
    > "$OUTDIR/split80.log" 2>&1
  say "sweep exit $?"; tee -a "$OUTDIR/chain.log" < "$OUTDIR/split80.log" | tail -8
fi
if [ "${TRACE:-0}" = 1 ]; then
  T=$(budget 250 180); say "verify timeline: ${T}s"
  timeout "$T" python3 -m minedraft.bench.gpu.step_trace --out "$OUTDIR/trace" --weights bf16 \
    --cells ar:16,verify:16:4,verify:64:4 > "$OUTDIR/trace.log" 2>&1
  say "timeline exit $?"
fi
if [[ $STAGES == *,key,* ]]; then
  T=$(budget 200 300); say "exactness files, chain on: ${T}s"
  MINEDRAFT_PDL=1 timeout "$T" "${PYTEST[@]}" "${KEY[@]}" > "$OUTDIR/key_tests.txt" 2>&1
  say "exactness files exit $? (124: out of time)"
  grep -E "FAILED|ERROR|passed|failed" "$OUTDIR/key_tests.txt" | tail -8 | tee -a "$OUTDIR/chain.log"
fi
if [[ $STAGES == *,rest,* ]]; then
  IGNORE=(); for f in "${KEY[@]}"; do IGNORE+=(--ignore "$f"); done
  T=$(budget 150 250); say "the rest of tests/gpu, chain on: ${T}s"
  MINEDRAFT_PDL=1 timeout "$T" "${PYTEST[@]}" tests/gpu "${IGNORE[@]}" > "$OUTDIR/rest_tests.txt" 2>&1
  say "rest exit $? (124: out of time)"
  grep -E "FAILED|ERROR|passed|failed" "$OUTDIR/rest_tests.txt" | tail -8 | tee -a "$OUTDIR/chain.log"
fi
if [[ $STAGES == *,steps,* ]]; then
  for pdl in 1 0; do
    T=$(budget 5 260); T=$(( pdl == 1 ? T / 2 : T )); say "step table, MINEDRAFT_PDL=$pdl: ${T}s"
    MINEDRAFT_PDL=$pdl timeout "$T" python3 -m minedraft.bench.gpu.step_profile --out "$OUTDIR/steps_pdl$pdl" \
      --weights bf16,fp8 --step-modes ar,verify --step-batches 1,16,64 --step-ks 4 --step-rounds 2 \
      > "$OUTDIR/steps_pdl$pdl.log" 2>&1
    say "step table exit $?"
  done
fi
say "done"
bundle "$OUTDIR"
