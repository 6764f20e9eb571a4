#!/usr/bin/env bash
# Block-scaled quantization's GPU evidence in one call (under 10 minutes), part A or B:
#   A: soundness, each block-scaled kernel's campaign of 3,000 cases (or SECONDS, whichever ends first), side by
#      side: torch:fp8-kv-token, torch:fp8-kv-blocks, torch:mxfp8 and flashcheck:triton-fp8-kv-blocks; no BUG and
#      no SUSPICIOUS may come out;
#   B: every planted bug of those kernels, each its own campaign of at most 40 cases (its first catching case is
#      the cases count of its row).
# Findings go to OUTDIR/corpus-* the moment they are found; a short table is printed last.
# Usage (repository root): bash benchmarks/gpu_quantized.sh OUTDIR A|B [SECONDS]
set -uo pipefail
source "$(dirname "$0")/gpu_fuzz.sh"
campaign_setup quantized 240 "$@"
kernels="torch:fp8-kv-token torch:fp8-kv-blocks torch:mxfp8 flashcheck:triton-fp8-kv-blocks"
for kernel in $kernels; do
  if [ "$part" = A ]; then
    fuzz "${kernel#*:}" "$kernel" 2 "$seconds" --max-examples 3000 &
  else
    for bug in $(python3 -c "import sys; from flashcheck.kernels.registry import planted_bugs
print(' '.join(planted_bugs(sys.argv[1])))" "$kernel"); do
      fuzz "${kernel#*:}-$bug" "$kernel~$bug" 1 "$seconds" --max-examples 40 &
    done
  fi
done
wait
campaign_archive "quantized-$part"
campaign_table | tee "$out/table-$part.txt"
