#!/usr/bin/env bash
# Issue 13 in one device call: the GPU engine tests, a profile of a tensor-parallel AR step, a profiled
# PSD probe (each probe also times a plan's round trip through the batch manager), and the placement sweep (PSD vs SD colocated, overlap, adaptive k). Everything lands in $OUT.
# Usage on the device machine, repository root, carrying `.whl` and `services/minedraft/proto`:
#   bash scripts/device_pace.sh            # nvidia-h200-x2: N = 1 (PSD on GPUs 0+1), TP = 2 profiled in AR
#   TP=2 bash scripts/device_pace.sh       # nvidia-h200-x4: N = 2 (target TP over GPUs 0-1, draft on GPU 2)
# ENGINE_TESTS=0 skips the engine tests, PROBE_S=0 the PSD probe (the sweep checks every output against AR anyway).
# Budget: about 10 minutes of wall time on x2 (engine tests ~2, probes ~4, sweep ~4); set SWEEP_S lower if needed.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/device_out}"; TP="${TP:-1}"; B=minedraft.bench.gpu
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || { echo "wheels"; exit 3; }
export PYTHONPATH="/tmp/site:$PWD/services:$PWD"
if [ "${ENGINE_TESTS:-1}" = 1 ]; then
timeout 240 python3 -m pytest -rs -p no:cacheprovider -s tests/gpu/test_engine_on_cuda.py tests/gpu/test_draft_ahead_on_cuda.py \
  tests/gpu/test_capture_ahead_on_cuda.py > "$OUT/engine_check.txt" 2>&1
RC=$?; echo "engine tests exit $RC"; tail -1 "$OUT/engine_check.txt"
[ "$RC" = 0 ] || [ -n "${KEEP_GOING:-}" ] || exit 4  # an engine that is not exact is not worth timing
fi
GPUS=$(nvidia-smi -L | wc -l)
if [ "$GPUS" -ge 2 ] && [ "${TP_PROBE:-1}" = 1 ]; then  # where a TP=2 step's time goes: both ranks profiled, AR at m = 16
  timeout 120 python3 -m $B.anatomy_probe --out /tmp/tp_probe --tp-size 2 --ar-only --points 4x16,4x32 \
    --steps 30 --control-trace --variant tp2 > "$OUT/tp_probe.log" 2>&1; echo "tp probe exit $?"
  # TP = 1 in the same call: the goal is a ratio of the two (TP = 2 <= 0.65x TP = 1 at m <= 32)
  timeout 90 python3 -m $B.anatomy_probe --out /tmp/tp1_probe --tp-size 1 --ar-only --points 4x16,4x32 \
    --steps 0 --control-trace --variant tp1 > "$OUT/tp1_probe.log" 2>&1; echo "tp1 probe exit $?"
fi
if [ "$GPUS" -gt "$TP" ]; then
  # "on": both workers launch ahead (the GPU default); "vonly": the draft service reads verdicts on the host.
  [ "${PROBE_S:-150}" = 0 ] || timeout "${PROBE_S:-150}" python3 -m $B.anatomy_probe --out /tmp/probe --tp-size "$TP" \
    --points "${PROBE_POINTS:-6x16,6x8,4x16}" --steps 30 --control-trace \
    --variant on --variant vonly:draft/MINEDRAFT_LAUNCH_AHEAD=off > "$OUT/probe.log" 2>&1; echo "probe exit $?"
  timeout "${SWEEP_S:-240}" python3 -m $B.placement_sweep --out /tmp/sweep --tp-size "$TP" \
    --acceptance "${LEVELS:-0.7,0.5,0.9}" --ks 4,6 --ms 8,16,32,64 --small-ks 4,6 --small-ms 16,64 --auto-ms 16,32 \
    --reps 2 --deadline-s "$(( ${SWEEP_S:-240} - 30 ))" > "$OUT/sweep.log" 2>&1; echo "sweep exit $?"
  cp /tmp/sweep/results.json "$OUT/sweep_results.json"; cp /tmp/sweep/results.md "$OUT/sweep_results.md"
fi
(cd /tmp && tar czf "$OUT/traces.tgz" probe/on/*.trace.json tp_probe/tp2/*.trace.json 2>/dev/null)
grep -h "tok/s" "$OUT"/*probe.log | tail -12
