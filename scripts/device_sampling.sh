#!/usr/bin/env bash
# On a CUDA machine, from the repository root: the CUDA engine tests, then the cost of logprobs and penalties
# per engine step on the synthetic 8B pair (bench/sampling_features.py). Needs the wheels docs/benchmarks/gpu.md
# lists in .whl and the generated stubs in services/minedraft/proto; results go to $OUT (default ./device_out).
set -u
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH="/tmp/site:$PWD/services:$PWD"
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
timeout 240 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_engine_on_cuda.py > $OUT/engine_check.txt 2>&1; echo "engine tests exit $?"; tail -5 $OUT/engine_check.txt
timeout 300 python3 -m minedraft.bench.sampling_features --pair llama3-8b --batch-sizes 1,16,64 --k 4 --tokens 32 --rounds 3 --out $OUT/sampling_features_h200.json > $OUT/sampling_features.log 2>&1; echo "bench exit $?"; cat $OUT/sampling_features.log | tail -20
