#!/usr/bin/env bash
# On a GPU machine: the BLAS plan with its Triton candidates against the tree before them, side by side.
# Carry `.whl`, `services/minedraft/proto` and `snap` (a copy of the earlier tree, with its proto stubs).
# Writes under $OUT: the GPU tests' log and alternating step tables (snap, this tree; ROUNDS of them, default 2),
# then the gate/up choices of both trees; at the end all of it packed into $OUT.tgz, the logs left beside it.
set -uo pipefail
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -rs --durations=8 -p no:cacheprovider ${TESTS:-tests/gpu/test_skinny_gemm.py \
  tests/gpu/test_blas_plan_on_cuda.py tests/gpu/test_engine_on_cuda.py} > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests exit $?"; tail -3 "$OUT/gpu_tests.txt"
STEP="--weights bf16 --step-modes ${MODES:-ar,verify} --step-batches ${BATCHES:-1,16,32,64} --step-ks 4 --step-rounds 3"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for tree in snap new; do
    if [ "$tree" = snap ]; then src="$PWD/snap/services"; else src="$PWD/services"; fi
    # shellcheck disable=SC2086
    PYTHONPATH="/tmp/site:$src:$PWD" timeout "${STEP_TIMEOUT:-150}" python3 -m minedraft.bench.gpu.step_profile \
      --blas auto --out "$OUT/steps_${tree}_$round" $STEP > "$OUT/steps_${tree}_$round.log" 2>&1
    echo "$tree $round exit $?"; grep -E "^\|" "$OUT/steps_${tree}_$round.log" | head -14
  done
done
# The plan's choices for gate/up and q/k/v in this tree (ops glu and rope: the timings include the kernels they
# fold in) and the tree before it (op linear), per row count, from the first round.
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
for tree in ("snap", "new"):
    path = Path(sys.argv[1]) / f"steps_{tree}_1" / "step_profile.json"
    if not path.exists():
        continue
    for row in json.loads(path.read_text()).get("blas", {}).get("choices", []):
        if row["out"] in (28672, 6144):
            print(tree, row)
PY
bundle "$OUT"  # one file back (the device returns 8 at most), the logs beside it
