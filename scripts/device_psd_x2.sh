#!/usr/bin/env bash
# PSD on two GPUs with the engine's features, in parts of under 10 minutes each.
# From the repository root on an nvidia-h200-x2 machine, carrying `.whl` and `services/minedraft/proto`:
#   PART=grid   bash scripts/device_psd_x2.sh $OUT/grid    # two-GPU exactness tests; the bf16 target: AR, SD
#                                                          #   colocated, SD-2GPU, PSD m/2+m/2 and m+m
#   PART=grid WEIGHTS=fp8 TESTS=0 bash scripts/device_psd_x2.sh $OUT/fp8   # the same grid, FP8 target
#   PART=eagle  bash scripts/device_psd_x2.sh $OUT/eagle   # the same grid with a synthetic EAGLE-3 head, then
#                                                          #   TETRIS against fixed k at m = 32 and 64
#   PART=serve  bash scripts/device_psd_x2.sh $OUT/serve   # prefix caching and chunked prefill on vs off, PSD
# Every cell's greedy output is checked against AR's (rows = AR in the tables). Knobs: KS, MS, LEVELS, REPS,
# DEADLINE (seconds the sweep may start cells in), TEST_S (the tests' share).
set -uo pipefail
OUT="${1:-${OUT:-$PWD/device_out}}"; mkdir -p "$OUT"
source scripts/device_env.sh
B=minedraft.bench.gpu
KS="${KS:-4,6}"; MS="${MS:-8,16,32,64}"; LEVELS="${LEVELS:-0.7}"; REPS="${REPS:-2}"
# Seconds a sweep may start cells in (its stacks' start counts); each sweep then gets 130 s more to finish its
# last cell and stop, so a part stays under 600 s: grid 120 s of tests + 280 (400 without the tests),
# eagle two sweeps of 160.
case "${PART:-grid}" in grid) [ "${TESTS:-1}" = 1 ] && D=280 || D=400 ;; *) D=320 ;; esac; DEADLINE="${DEADLINE:-$D}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.log"
sweep() {  # one placement sweep into $OUT/$1, the rest of the arguments its own
  local name="$1"; shift
  timeout $(( DEADLINE + 130 )) python3 -m $B.placement_sweep --out "$OUT/$name" --acceptance "$LEVELS" --ks "$KS" \
    --ms "$MS" --small-ks "$KS" --small-ms "$MS" --auto-ms "" --reps "$REPS" --deadline-s "$DEADLINE" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name sweep exit $?"; tail -40 "$OUT/$name.log" | grep -E "^\|" | head -40
}
case "${PART:-grid}" in
  grid)
    if [ "${TESTS:-1}" = 1 ]; then
      timeout "${TEST_S:-120}" python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_engine_on_cuda.py \
        tests/gpu/test_fp8_on_cuda.py tests/gpu/test_eagle_on_cuda.py > "$OUT/tests.log" 2>&1
      echo "tests exit $?"; tail -3 "$OUT/tests.log"
    fi
    sweep grid --weights "${WEIGHTS:-bf16}" --drafters model ;;
  eagle)
    DEADLINE=$(( DEADLINE / 2 )) sweep eagle --weights bf16 --drafters eagle
    DEADLINE=$(( DEADLINE / 2 )) sweep tetris --weights bf16 --drafters model --ms "" --tetris-ms 32,64 ;;
  serve)
    for bench in prefix-cache chunked-prefill; do
      timeout 280 python3 -m minedraft.cli.main bench "$bench" --device cuda --placement psd --rounds 1 \
        --json-out "$OUT/$bench.json" > "$OUT/$bench.log" 2>&1
      echo "$bench exit $?"; grep -E "^\||identical" "$OUT/$bench.log" | head -12
    done ;;
  *) echo "PART is grid, eagle or serve"; exit 2 ;;
esac
