#!/usr/bin/env bash
# TETRIS on a GPU machine: the GPU tests of the ragged path, then TETRIS
# against fixed k and AR at batch 16/32/64 on the synthetic 8B pair (in-process SD colocated:
# bench/tetris_bench.py), writing JSON under $OUT. The goal: at batch 64, TETRIS >= AR and >= the best fixed k.
# Usage on the device machine, repository root, carrying `.whl` and `services/minedraft/proto`:
#   bash scripts/device_tetris.sh        # ENGINE_TESTS=0 skips the tests; KS, BATCHES, STEPS override the grid
set -uo pipefail
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
source scripts/device_env.sh
if [ "${ENGINE_TESTS:-1}" = 1 ]; then
  timeout 240 python3 -m pytest -rs -p no:cacheprovider tests/gpu/test_tetris_on_cuda.py tests/gpu/test_engine_on_cuda.py \
    > "$OUT/tetris_tests.txt" 2>&1
  RC=$?; echo "gpu tests exit $RC"; tail -1 "$OUT/tetris_tests.txt"
  [ "$RC" = 0 ] || [ -n "${KEEP_GOING:-}" ] || exit 4  # an engine that is not exact is not worth timing
fi
timeout 480 python3 -m minedraft.bench.tetris_bench --synthetic llama3-8b --agree "${AGREE:-0.7}" --draft-layers 4 \
  --batches "${BATCHES:-16,32,64}" --ks "${KS:-2,4,6}" --extra "${EXTRA:-3}" --steps "${STEPS:-20}" \
  --num-blocks 8192 --out "$OUT/tetris_bench.json" > "$OUT/tetris_bench.log" 2>&1
echo "bench exit $?"; tail -20 "$OUT/tetris_bench.log"
