#!/usr/bin/env bash
# Multi-head latent attention's GPU evidence in one call (under 10 minutes), part A or B:
#   A: soundness, the correct MLA kernels' campaigns on the mla preset side by side for SECONDS each: torch:mla,
#      torch:mla-paged and flashcheck:triton-mla (paged, judged at each of its split counts); no BUG and no
#      SUSPICIOUS may come out, and the cases judged add up to the issue's sample;
#   B: every planted bug of the MLA kernels, each its own campaign of at most 40 cases on the adversarial preset (its
#      first catching case is the cases count of its row).
# Findings go to OUTDIR/corpus-* the moment they are found; a short table is printed last.
# Usage (repository root): bash benchmarks/gpu_mla.sh OUTDIR A|B [SECONDS]
set -uo pipefail
source "$(dirname "$0")/gpu_fuzz.sh"
campaign_setup mla 240 "$@"
if [ "$part" = A ]; then
  export FUZZ_PRESET=mla
  for dtype in fp16 bf16 fp32; do
    fuzz "mla-$dtype" torch:mla 1 "$seconds" --dtype "$dtype" &
    fuzz "mla-paged-$dtype" torch:mla-paged 1 "$seconds" --dtype "$dtype" &
    fuzz "triton-mla-$dtype" flashcheck:triton-mla 2 "$seconds" --dtype "$dtype" &
  done
  wait
else
  for kernel in torch:mla torch:mla-paged flashcheck:triton-mla; do
    for bug in $(python3 -c "import sys; from flashcheck.kernels.registry import planted_bugs; print(' '.join(planted_bugs(sys.argv[1])))" "$kernel"); do
      fuzz "${kernel//:/-}-$bug" "$kernel~$bug" 1 90 --max-examples 40 &
    done
    wait
  done
fi
tar -czf "$out/mla-$part.tgz" -C "$work" . 2>/dev/null
campaign_table | tee "$out/table-$part.txt"
