#!/usr/bin/env bash
# On one CUDA GPU, from the repository root: the CUDA test of structured outputs, then what grammar masks
# (and logprobs, penalties) cost per engine step on the bundled tiny pair (bench/sampling_features.py; the
# synthetic 8B pair has no tokenizer, so no grammar). Needs the wheels docs/benchmarks/gpu.md lists in .whl
# (llguidance among them) and the generated stubs in services/minedraft/proto; results go to $OUT.
set -u
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH="/tmp/site:$PWD/services:$PWD"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt"
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_structured_on_cuda.py > "$OUT/structured_check.txt" 2>&1
echo "structured tests exit $?"; tail -5 "$OUT/structured_check.txt"
timeout 300 python3 -m minedraft.bench.sampling_features --pair tiny --device cuda:0 --batch-sizes 1,16,64 --k 4 \
  --tokens 32 --rounds 3 --out "$OUT/sampling_features_tiny_h200.json" > "$OUT/sampling_features.log" 2>&1
echo "bench exit $?"; tail -12 "$OUT/sampling_features.log"
