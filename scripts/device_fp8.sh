#!/usr/bin/env bash
# On a GPU machine (Hopper): tune the FP8 GEMM tiles, prove the table (every row's bits the same at
# every M), run the FP8 GPU tests and the FP8 probe with exactly that table.
# Usage on the device machine, from the repository root (carry `.whl` and `services/minedraft/proto`):
#   bash scripts/device_fp8.sh OUTDIR
# FP8_DEADLINE (seconds, default 215) bounds the whole script: each stage gets what is left, and cells
# past the deadline are skipped and listed. FP8_TUNE (seconds) sets the tuner's share (default: what
# the deadline leaves after 130 s, at most 85); FP8_SCHEMES (default block,channel) which schemes it
# tunes: the others keep the committed table's entries; FP8_MIN_M (default 1) the smallest bucket it
# times: smaller ones keep the committed table's chunks and tiles. Writes under OUTDIR (8 files): fp8_tiles.json (the tuned
# table: commit it as services/minedraft/engine/cuda/fp8_tiles.json), fp8_tune.json/.md,
# fp8_probe_block.json, fp8_probe_block_plain.json (decode steps with that table's dependent launches
# off) and fp8_tiles_plain.json (that table), fp8_probe_channel.json, fp8.log (everything printed).
set -uo pipefail
OUTDIR="${1:?usage: scripts/device_fp8.sh OUTDIR}"
mkdir -p "$OUTDIR"
START=$(date +%s)
DEADLINE="${FP8_DEADLINE:-215}"
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
clamp() { local v=$1; (( v > $2 )) && v=$2; (( v < 1 )) && v=1; echo "$v"; }
LOG="$OUTDIR/fp8.log"
: > "$LOG"
say() { echo "[fp8 $(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >> "$LOG" 2>&1

# 1. tune and check bit identity (the tuner drops a shape whose rows differ across M and exits 1)
TUNE="${FP8_TUNE:-$(clamp $(( $(left) - 130 )) 85)}"
SCHEMES="${FP8_SCHEMES:-block,channel}"
say "tune ($SCHEMES): ${TUNE}s"
timeout $(( TUNE + 15 )) python3 -m minedraft.bench.gpu.fp8_tune "$OUTDIR" --deadline "$TUNE" --schemes "$SCHEMES" \
  --min-m "${FP8_MIN_M:-1}" >> "$LOG" 2>&1
say "tune exit $?"
TABLE="$OUTDIR/fp8_tiles.json"
if [ -f "$TABLE" ]; then
  export MINEDRAFT_FP8_TILES="$TABLE"
else
  say "no tuned table: the tests and probe use the committed one"
fi

# 2. the FP8 GPU tests with that table (kernel vs reference, rows per M for every tabled shape, SD == AR)
T=$(clamp $(( $(left) - 50 )) 75)
say "pytest: ${T}s"
timeout "$T" python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_fp8_on_cuda.py >> "$LOG" 2>&1
say "pytest exit $? (124: out of time)"

# 3. the probe: AR decode steps bf16 vs FP8 (block) and the per-GEMM table, then channel GEMMs if time is left
P=$(( $(left) - 8 ))
if (( P > 20 )); then
  say "probe block: ${P}s"
  timeout $(( P + 5 )) python3 -m minedraft.bench.gpu.fp8_probe "$OUTDIR/fp8_probe_block.json" --scheme block \
    --decode-first --deadline $(( P - 10 )) >> "$LOG" 2>&1
  say "probe block exit $?"
else
  say "skipped: probe block (out of time)"
fi
# 4. the same decode steps with every dependent launch turned off (the fair test of `pdl`: the tuner
#    times GEMMs back to back, where such a launch overlaps the previous GEMM's end)
P=$(( $(left) - 12 ))
if (( P > 20 )) && [ -f "$TABLE" ]; then
  python3 -c "import json,sys; t=json.load(open(sys.argv[1])); [b.update(pdl=False) for s in t['shapes'].values() \
for b in s['buckets']]; json.dump(t, open(sys.argv[2], 'w'), indent=1)" "$TABLE" "$OUTDIR/fp8_tiles_plain.json"
  say "probe block without dependent launches: ${P}s"
  MINEDRAFT_FP8_TILES="$OUTDIR/fp8_tiles_plain.json" timeout $(( P + 5 )) python3 -m minedraft.bench.gpu.fp8_probe \
    "$OUTDIR/fp8_probe_block_plain.json" --scheme block --decode-first --batches 1,16 --deadline $(( P - 8 )) >> "$LOG" 2>&1
  say "probe block plain exit $?"
fi
P=$(( $(left) - 3 ))
if (( P > 15 )); then
  timeout "$P" python3 -m minedraft.bench.gpu.fp8_probe "$OUTDIR/fp8_probe_channel.json" --scheme channel \
    --gemm-only --deadline $(( P - 8 )) >> "$LOG" 2>&1
  say "probe channel exit $?"
else
  say "skipped: probe channel GEMMs (out of time)"
fi
say "done"
grep -E "^\| |bit identity|decode b=|passed|failed|error|skipped|out of time|exit" "$LOG" | tail -70
