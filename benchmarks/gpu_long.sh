#!/usr/bin/env bash
# Long contexts on the H200 in one call (under 10 minutes), part A, B or C:
#   A: benchmarks/bench_long_oracle.py (the oracle's time and memory against N, decode to 1M keys), then
#      tests/gpu/test_long_context_gpu.py beside long-context campaigns of torch:flash, flashcheck:triton and
#      its planted flashcheck:triton~key_position_in_fp16 for SECONDS each; then both long planted bugs on the
#      adversarial preset (short rows) for 60 s;
#   B: tests/gpu/test_long_context_gpu.py, then long-context campaigns of torch:efficient, torch:cudnn,
#      torch:flex and the planted flashcheck:triton~int32_offsets for SECONDS each;
#   C: torch:flex and flashcheck:triton~int32_offsets alone, for SECONDS each (B's four campaigns and their
#      cases past 2^31 elements ran the host out of memory: torch:flex's process was killed).
# One worker a campaign: a case past 2^31 elements takes ~20 GiB of host memory while its values are drawn.
# Findings go to OUTDIR/corpus-* the moment they are found; everything is packed into OUTDIR/long-PART.tgz;
# a short table is printed last.
# Usage (repository root): bash benchmarks/gpu_long.sh OUTDIR A|B|C [SECONDS]
set -uo pipefail
source "$(dirname "$0")/gpu_fuzz.sh"
campaign_setup long 240 "$@"
export FUZZ_PRESET=long-context
if [ "$part" = A ]; then
  timeout 150 python3 benchmarks/bench_long_oracle.py --device cuda --max-n 131072 --max-decode 1048576 --max-prefill 32768 \
      --json "$work/oracle-against-n.json" --plot "$work/oracle-against-n.png" > "$work/oracle-against-n.txt" 2>&1
  timeout 330 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_long_context_gpu.py > "$work/gpu_tests.txt" 2>&1 &
  fuzz long-flash torch:flash 1 "$seconds" &
  fuzz long-triton flashcheck:triton 1 "$seconds" &
  fuzz long-triton-key_position_in_fp16 'flashcheck:triton~key_position_in_fp16' 1 "$seconds" &
  wait
  for bug in int32_offsets key_position_in_fp16; do
    FUZZ_PRESET=adversarial fuzz "short-triton-$bug" "flashcheck:triton~$bug" 2 60 &
  done
  wait
  cat "$work/oracle-against-n.txt"
elif [ "$part" = C ]; then
  fuzz long-flex torch:flex 1 "$seconds" &
  fuzz long-triton-int32_offsets 'flashcheck:triton~int32_offsets' 1 "$seconds" &
  wait
else
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_long_context_gpu.py > "$work/gpu_tests.txt" 2>&1
  fuzz long-efficient torch:efficient 1 "$seconds" &
  fuzz long-cudnn torch:cudnn 1 "$seconds" &
  fuzz long-flex torch:flex 1 "$seconds" &
  fuzz long-triton-int32_offsets 'flashcheck:triton~int32_offsets' 1 "$seconds" &
  wait
fi
cp "$work/machine.txt" "$out/"
# A case past 2^31 elements is 8 GiB of arrays: its JSON (with the recipe that rebuilds it) comes back alone.
find "$work" -name '*.npz' -size +4M -delete
tar -czf "$out/long-$part.tgz" --exclude=.hypothesis -C "$work" .
campaign_table
