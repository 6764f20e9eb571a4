#!/usr/bin/env bash
# Multi-head latent attention's GPU evidence in one call (under 10 minutes), part A or B:
#   A: soundness, the correct MLA kernels' campaigns side by side for SECONDS each: torch:mla, torch:mla-paged and
#      flashcheck:triton-mla (paged, judged at each of its split counts), on the mla preset (1k to 128k keys) in fp16
#      and bf16 and on the adversarial preset (short rows, every dtype, many more cases); no BUG and no SUSPICIOUS
#      may come out, and the cases judged add up to the issue's sample;
#   B: every planted bug of the MLA kernels, each its own campaign of at most 40 cases on the adversarial preset (its
#      first catching case is the cases count of its row), all side by side.
# Findings go to OUTDIR/corpus-* the moment they are found; a short table is printed last.
# Usage (repository root): bash benchmarks/gpu_mla.sh OUTDIR A|B [SECONDS]
set -uo pipefail
source "$(dirname "$0")/gpu_fuzz.sh"
campaign_setup mla 240 "$@"
kernels="torch:mla torch:mla-paged flashcheck:triton-mla"
if [ "$part" = A ]; then
  for kernel in $kernels; do
    for dtype in fp16 bf16; do
      FUZZ_PRESET=mla fuzz "${kernel//:/-}-mla-$dtype" "$kernel" 1 "$seconds" --dtype "$dtype" &
    done
    fuzz "${kernel//:/-}-adversarial" "$kernel" 2 "$seconds" &
  done
  wait
else
  for kernel in $kernels; do
    for bug in $(python3 -c "import sys; from flashcheck.kernels.registry import planted_bugs; print(' '.join(planted_bugs(sys.argv[1])))" "$kernel"); do
      fuzz "${kernel//:/-}-$bug" "$kernel~$bug" 1 "$seconds" --max-examples 40 &
    done
  done
  wait
fi
campaign_archive "mla-$part"
campaign_table | tee "$out/table-$part.txt"
