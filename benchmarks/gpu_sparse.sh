#!/usr/bin/env bash
# Sparse attention's GPU evidence in one call (under 10 minutes), part A or B:
#   A: soundness, the correct sparse kernels' campaigns side by side for SECONDS each, forward and backward where
#      they have one: torch:sparse (once and twice), flashcheck:triton-sparse, torch:block-sparse (masked and
#      trusted full blocks), flashcheck:triton-block-sparse and torch:flex-block-sparse (FlexAttention's compiled block-sparse path); no BUG and no
#      SUSPICIOUS may come out, and the cases judged add up to the sign-off's sample;
#   B: every planted bug of the sparse kernels, each its own campaign of at most 40 cases (its first catching case
#      is the cases count of its row), all side by side with FlexAttention's block-sparse path on the sparse preset.
#   C: part A's twice convention and backward campaigns alone (a rerun after a change to the twin or the budget);
#   D: the block-list references' campaigns, every dtype and fp32 on its own (a rerun after a change to the envelope
#      of one-pass contracts, whose fp32 cases it decides), beside the references of index sets on the serving forms
#      and MLA's paged decode and each of their planted bugs (at most 40 cases).
# Findings go to OUTDIR/corpus-* the moment they are found; a short table is printed last.
# Usage (repository root): bash benchmarks/gpu_sparse.sh OUTDIR A|B|C|D [SECONDS]
set -uo pipefail
source "$(dirname "$0")/gpu_fuzz.sh"
campaign_setup sparse 150 "$@"
bugs() {  # KERNEL: its planted bugs' names
  python3 -c "import sys; from flashcheck.kernels.registry import planted_bugs; print(' '.join(planted_bugs(sys.argv[1])))" "$1"
}
if [ "$part" = A ]; then
  fuzz sparse torch:sparse 2 "$seconds" &
  fuzz sparse-twice 'torch:sparse[duplicates=twice]' 2 "$seconds" &
  fuzz sparse-backward torch:sparse 1 "$seconds" --backward &
  fuzz triton-sparse flashcheck:triton-sparse 3 "$seconds" &
  fuzz triton-sparse-backward flashcheck:triton-sparse 2 "$seconds" --backward &
  fuzz block-sparse torch:block-sparse 1 "$seconds" &
  fuzz triton-block-sparse flashcheck:triton-block-sparse 2 "$seconds" &
  fuzz triton-block-sparse-backward flashcheck:triton-block-sparse 1 "$seconds" --backward &
  fuzz block-sparse-trusted 'torch:block-sparse[full_blocks=trusted]' 1 "$seconds" &
  fuzz flex-block-sparse 'torch:flex-block-sparse[q_block=64,kv_block=64]' 3 "$seconds" &
  wait
elif [ "$part" = C ]; then
  fuzz sparse-twice 'torch:sparse[duplicates=twice]' 2 "$seconds" &
  fuzz sparse-backward torch:sparse 1 "$seconds" --backward &
  fuzz triton-sparse-backward flashcheck:triton-sparse 2 "$seconds" --backward &
  wait
elif [ "$part" = D ]; then
  fuzz block-sparse torch:block-sparse 2 "$seconds" &
  fuzz block-sparse-trusted 'torch:block-sparse[full_blocks=trusted]' 2 "$seconds" &
  fuzz block-sparse-fp32 torch:block-sparse 2 "$seconds" --dtype fp32 &
  for kernel in torch:sparse-varlen torch:sparse-paged torch:mla-sparse; do
    fuzz "${kernel//:/-}" "$kernel" 1 "$seconds" &
    for bug in $(bugs "$kernel"); do
      fuzz "${kernel//:/-}-$bug" "$kernel~$bug" 1 "$seconds" --max-examples 40 &
    done
  done
  wait
else
  for kernel in torch:sparse flashcheck:triton-sparse torch:block-sparse flashcheck:triton-block-sparse; do
    for bug in $(bugs "$kernel"); do
      pass=$([ "$bug" = dk_written_not_added ] && echo --backward)
      fuzz "${kernel//:/-}-$bug" "$kernel~$bug" 1 "$seconds" --max-examples 40 $pass &
    done
  done
  FUZZ_PRESET=sparse fuzz flex-block-sparse-preset 'torch:flex-block-sparse' 4 "$seconds" &
  wait
fi
campaign_archive "sparse-$part"
campaign_table | tee "$out/table-$part.txt"
