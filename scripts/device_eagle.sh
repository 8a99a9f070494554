#!/usr/bin/env bash
# EAGLE on one GPU: the GPU tests of the head path (the bundled EAGLE-1 head and the synthetic EAGLE-3 head,
# greedy SD equal to AR on the Triton kernels), then the synthetic 8B target drafting with the 4-layer
# synthetic draft model and with the synthetic EAGLE-3 head at the same agreement, batch 1/16/32/64,
# k = 4 then 6 as the deadline allows (bench/gpu/eagle_probe.py): tokens/s, acceptance, the step's draft,
# verify and host parts and the draft's bandwidth bound, AR beside them. About 240 s; output under $OUT.
# Usage on the device machine, repository root, carrying `.whl` and `services/minedraft/proto`:
#   bash scripts/device_eagle.sh   # ENGINE_TESTS=0 skips the tests (TEST_S bounds them, default 90 s); BATCHES, KS,
#   AGREE, DEADLINE override
set -uo pipefail
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
source scripts/device_env.sh
if [ "${ENGINE_TESTS:-1}" = 1 ]; then
  timeout "${TEST_S:-90}" python3 -m pytest -rs -p no:cacheprovider tests/gpu/test_eagle_on_cuda.py > "$OUT/eagle_tests.txt" 2>&1
  RC=$?; echo "gpu tests exit $RC"; tail -1 "$OUT/eagle_tests.txt"
  [ "$RC" = 0 ] || [ -n "${KEEP_GOING:-}" ] || exit 4  # a head path that is not exact is not worth timing
fi
timeout 180 python3 -m minedraft.bench.gpu.eagle_probe --agree "${AGREE:-0.7}" --draft-layers 4 \
  --batches "${BATCHES:-1,16,32,64}" --ks "${KS:-4,6}" --deadline-s "${DEADLINE:-140}" \
  --out "$OUT/eagle_probe.json" > "$OUT/eagle_probe.log" 2>&1
echo "probe exit $?"; tail -16 "$OUT/eagle_probe.log"
