#!/usr/bin/env bash
# TETRIS on one GPU, inside a deadline: the GPU tests of the ragged path, then TETRIS against fixed k and AR
# on the synthetic 8B pair with a calibrated draft (in-process SD colocated: bench/tetris_bench.py), batch 64
# then 32 (the batch that matters most first, should the deadline cut the sweep), k 4 and 6, extras 0, 1, 2
# (0: draft k and verify only the drafts worth it). Every TETRIS cell prunes by theta = m x R from the AR and
# fixed-k cells run just before it (MIN_PROB=auto; a number fixes it, 0 turns the floor off).
# The draft agrees with the target on 70% of tokens and is unsure (max q ~0.3) on 80% of the 30% it gets
# wrong (CALIB=0.8): a draft whose confidence separates right from wrong drafts well but not perfectly, a
# fifth of its mistakes made with full confidence, none of its right choices doubted (MISCAL=0).
# CALIB=0 is the always-sure draft, where selection keeps exactly fixed k's slots.
# Usage on the device machine, repository root, carrying `.whl` and `services/minedraft/proto`:
#   bash scripts/device_tetris.sh        # results under $OUT (default ./device_out)
# DEADLINE (seconds, default 300) bounds the whole script; ENGINE_TESTS=0 skips the tests (TEST_S bounds them,
# default 90 s); AGREE, CALIB,
# MISCAL, BATCHES, KS, EXTRAS, STEPS, MIN_PROB, TILES (row tiles, e.g. 128,1) override the grid; HOST_SELECT=1 also runs each TETRIS cell with
# its selection read back before the verify (the cell "tetris-host"), beside the one that keeps it on the GPU. Writes tetris_tests.txt, tetris_bench.json (after
# every cell, so a cut run keeps what it measured), tetris_bench.log and tetris.log.
set -uo pipefail
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
START=$(date +%s)
DEADLINE="${DEADLINE:-300}"
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
LOG="$OUT/tetris.log"
: > "$LOG"
say() { echo "[tetris $(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$LOG" 2>&1

if [ "${ENGINE_TESTS:-1}" = 1 ]; then
  T=$(( $(left) - 200 )); (( T > ${TEST_S:-90} )) && T=${TEST_S:-90}
  say "ragged-path gpu tests: ${T}s"
  timeout "$T" python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_tetris_on_cuda.py \
    tests/gpu/test_packed_attention_kernel.py > "$OUT/tetris_tests.txt" 2>&1
  RC=$?; say "gpu tests exit $RC (124: out of time)"; tail -1 "$OUT/tetris_tests.txt" | tee -a "$LOG"
  [ "$RC" = 0 ] || [ -n "${KEEP_GOING:-}" ] || exit 4  # an engine that is not exact is not worth timing
fi

T=$(( $(left) - 5 ))
say "bench: ${T}s, no new cell after $(( T - 25 ))s"
timeout "$T" python3 -m minedraft.bench.tetris_bench --synthetic llama3-8b --draft-layers 4 \
  --agree "${AGREE:-0.7}" --calib "${CALIB:-0.8}" --miscal "${MISCAL:-0}" \
  --batches "${BATCHES:-64,32}" --ks "${KS:-4,6}" --extras "${EXTRAS:-0,1,2}" --steps "${STEPS:-16}" \
  --min-prob "${MIN_PROB:-auto}" ${HOST_SELECT:+--host-select} --tiles "${TILES:-0}" \
  --warmup 3 --anatomy-steps 6 --num-blocks 4096 --deadline-s $(( T - 25 )) \
  --out "$OUT/tetris_bench.json" > "$OUT/tetris_bench.log" 2>&1
say "bench exit $? (1: a row left AR's tokens; 124: out of time)"
grep -E "^batch|skipped" "$OUT/tetris_bench.log" | tee -a "$LOG"
say "done"
