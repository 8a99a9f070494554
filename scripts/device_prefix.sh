#!/usr/bin/env bash
# On one CUDA GPU, from the repository root: `minedraft bench prefix-cache` (caching on vs off) and
# `minedraft bench chunked-prefill` (chunked vs unchunked), each arm on its own fresh stack of the services,
# SD with the draft beside the target on the one GPU, the synthetic Llama-3-8B-shaped pair in bf16.
# Needs the wheels docs/benchmarks/gpu.md lists in .whl and the generated stubs in services/minedraft/proto;
# results go to $OUT (default ./device_out).
# A CPU dry run of the same commands at tiny sizes (no wheels, the project's venv):
#   DEVICE=cpu PYTHON=.venv/bin/python WHEELS=0 PREFIX_ARGS="--requests 4 --prefix-tokens 64 --conversations 2
#   --turns 2" CHUNKED_ARGS="--streams 2 --stream-tokens 64 --long-prompts 1 --long-tokens 300"
#   bash scripts/device_prefix.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/device_out}"
PYTHON="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
ROUNDS="${ROUNDS:-2}"
mkdir -p "$OUT"
if [ "${WHEELS:-1}" = 1 ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 3; }
  export PYTHONPATH="/tmp/site:$PWD/services:$PWD"
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  nproc; } > "$OUT/machine.txt"
cat "$OUT/machine.txt"
read -r -a PREFIX_EXTRA <<< "${PREFIX_ARGS:-}"
read -r -a CHUNKED_EXTRA <<< "${CHUNKED_ARGS:-}"
timeout "${PREFIX_TIMEOUT:-270}" "$PYTHON" -m minedraft.cli.main bench prefix-cache --device "$DEVICE" \
  --rounds "$ROUNDS" --json-out "$OUT/prefix_cache.json" "${PREFIX_EXTRA[@]}" > "$OUT/prefix_cache.log" 2>&1
echo "prefix-cache exit $?"
tail -20 "$OUT/prefix_cache.log"
timeout "${CHUNKED_TIMEOUT:-220}" "$PYTHON" -m minedraft.cli.main bench chunked-prefill --device "$DEVICE" \
  --rounds "$ROUNDS" --json-out "$OUT/chunked_prefill.json" "${CHUNKED_EXTRA[@]}" > "$OUT/chunked_prefill.log" 2>&1
echo "chunked-prefill exit $?"
tail -12 "$OUT/chunked_prefill.log"
