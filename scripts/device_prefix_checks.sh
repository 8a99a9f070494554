#!/usr/bin/env bash
# On one CUDA GPU, from the repository root: the CUDA tests of prefix caching and chunked prefill and of the
# engine, the probe of a batch of cache hits' first step (bench/gpu/prefix_probe.py, synthetic 8B target), and
# `minedraft bench chunked-prefill` at several token budgets (BUDGETS), and with PREFIX_BENCH=1
# `minedraft bench prefix-cache`. Needs the wheels
# docs/benchmarks/gpu.md lists in .whl and the generated stubs in services/minedraft/proto; results go to $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/device_out}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 3; }
export PYTHONPATH="/tmp/site:$PWD/services:$PWD"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; nproc; } > "$OUT/machine.txt"
cat "$OUT/machine.txt"
timeout 200 "$PYTHON" -m pytest -q -p no:cacheprovider tests/gpu/test_prefix_cache_on_cuda.py tests/gpu/test_engine_on_cuda.py \
  > "$OUT/cuda_tests.log" 2>&1
echo "cuda tests exit $?"; tail -5 "$OUT/cuda_tests.log"
for lp in ${PROBE_LOGPROBS-none 0}; do
  extra=(); [ "$lp" = none ] || extra=(--logprobs "$lp")
  timeout 120 "$PYTHON" -m minedraft.bench.gpu.prefix_probe --rows 63 --prefix 2048 --suffix 16 --rounds 3 \
    "${extra[@]}" --json-out "$OUT/prefix_probe_logprobs_$lp.json" > "$OUT/prefix_probe_$lp.log" 2>&1
  echo "probe (logprobs $lp) exit $?"; grep -E "ms|hit" "$OUT/prefix_probe_$lp.log" | tr -s ' ' | tr '\n' ' '; echo
done
for budget in ${BUDGETS:-512 1024}; do
  timeout 150 "$PYTHON" -m minedraft.cli.main bench chunked-prefill --device cuda --rounds 1 --budget "$budget" \
    --json-out "$OUT/chunked_prefill_$budget.json" > "$OUT/chunked_prefill_$budget.log" 2>&1
  echo "chunked-prefill budget $budget exit $?"; tail -8 "$OUT/chunked_prefill_$budget.log"
done
if [ "${PREFIX_BENCH:-0}" = 1 ]; then
  timeout 200 "$PYTHON" -m minedraft.cli.main bench prefix-cache --device cuda --rounds 2 \
    --json-out "$OUT/prefix_cache.json" > "$OUT/prefix_cache.log" 2>&1
  echo "prefix-cache exit $?"; tail -12 "$OUT/prefix_cache.log"
fi
