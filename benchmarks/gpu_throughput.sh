#!/usr/bin/env bash
# Campaign throughput on a CUDA machine in one call (under 10 minutes), part A, B, L or C, through
# benchmarks/bench_campaign.py (a fresh `flashcheck fuzz` per row, ratios within one call):
#   A: tests/gpu/test_drawing_gpu.py, then one process of torch:flash on the adversarial preset, with its kernel
#      in a worker process and in-process, on this checkout and on BEFORE (an older checkout's src/, if set);
#   B: torch:flash with --jobs 2, 4, 8 and 16, and --jobs 16 backward;
#   L: the long-context preset between 64k and 128k keys (benchmarks/long-64k.toml) in one and in four
#      processes, cases drawn on the GPU (FLASHCHECK_DRAW=device);
#   C: two GPUs: --jobs 16 on one of them (CUDA_VISIBLE_DEVICES=0), then on both.
# Rows run SECONDS each (default 40); the table is printed last, JSON rows go to OUTDIR/throughput-PART.json.
# Usage (repository root): [BEFORE=path/to/src] bash benchmarks/gpu_throughput.sh OUTDIR A|B|L|C [SECONDS]
set -uo pipefail
source "$(dirname "$0")/gpu_fuzz.sh"
campaign_setup throughput 40 "$@"
bench() {  # ROWS [bench_campaign ARGUMENTS...]
  local rows=$1; shift
  python3 benchmarks/bench_campaign.py --device cuda --rows "$rows" --seconds "$seconds" "$@" \
      --json "$out/throughput-$part.json" 2> "$out/throughput-$part.log"
}
if [ "$part" = A ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_drawing_gpu.py > "$out/gpu_tests.txt" 2>&1
  tail -3 "$out/gpu_tests.txt"
  before=(); [ -n "${BEFORE:-}" ] && before=(--src "before=$BEFORE")
  bench flash-1-worker,flash-1 "${before[@]}"
elif [ "$part" = B ]; then
  bench flash-2,flash-4,flash-8,flash-16,flash-16-backward
elif [ "$part" = L ]; then
  FLASHCHECK_DRAW=device bench long-1,long-4
else
  CUDA_VISIBLE_DEVICES=0 bench flash-16
  mv "$out/throughput-$part.json" "$out/throughput-$part-one-gpu.json"
  bench flash-16
fi
