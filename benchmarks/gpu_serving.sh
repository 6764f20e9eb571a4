#!/usr/bin/env bash
# The serving forms' H200 evidence in one call (under 10 minutes), part A or B:
#   A: tests/gpu/test_serving_gpu.py, then adversarial campaigns of the correct references over flash
#      (torch:varlen[backend=flash], torch:paged[backend=flash]) for SECONDS each, side by side;
#   B: each planted bug of the forms (its campaign must find it), torch:jagged (PyTorch's nested tensors),
#      torch:flex-varlen (FlexAttention's document mask) and fla:parallel_attn-varlen (fla-core's cu_seqlens);
#   C: tests/gpu/test_serving_gpu.py, then flashcheck:triton-varlen for SECONDS beside its planted bug and
#      torch:split-kv with its two planted merge bugs;
#   D: tests/gpu/test_fp8_gpu.py, then flashcheck:triton-fp8 and torch:fp8 for SECONDS beside their planted
#      ignored k_descale;
#   E: tests/gpu/test_serving_gpu.py and test_fp8_gpu.py, then flashcheck:triton-fp8, flashcheck:triton-paged,
#      flashcheck:triton-split-kv and torch:split-kv for SECONDS beside the Triton kernels' planted bugs;
#   F: tests/gpu/test_fp8_gpu.py, then flashcheck:triton-fp8, flashcheck:triton-split-kv and
#      flashcheck:triton-paged alone for SECONDS (their first run compiles one kernel per head dim);
#   G: tests/gpu/test_serving_gpu.py and test_fla_gpu.py beside campaigns of fla:attn_decoding (fla-core's
#      decoding step), torch:split-kv and flashcheck:triton-split-kv on the adversarial preset, and of the
#      references over flash on the serving preset, for SECONDS each;
#   H: tests/gpu/test_fla_gpu.py and reports/serving-2026-12-03/fla_decoding_probe.py, then fla:attn_decoding
#      (fp32, its spec's one dtype), torch:split-kv and flashcheck:triton-split-kv for SECONDS each.
# Findings go to OUTDIR/corpus-* the moment they are found; everything is packed into OUTDIR/serving-PART.tgz;
# a short table is printed last.
# Usage (repository root): bash benchmarks/gpu_serving.sh OUTDIR A|B|C|D|E|F|G|H [SECONDS]
set -uo pipefail
source "$(dirname "$0")/gpu_fuzz.sh"
campaign_setup serving 200 "$@"
if [ "$part" = A ]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_serving_gpu.py > "$work/gpu_tests.txt" 2>&1
  python3 benchmarks/serving_probe.py cuda > "$work/probe.txt" 2>&1
  fuzz varlen 'torch:varlen[backend=flash]' 7 "$seconds" &
  fuzz paged 'torch:paged[backend=flash]' 7 "$seconds" &
  wait
elif [ "$part" = C ]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_serving_gpu.py > "$work/gpu_tests.txt" 2>&1
  fuzz triton-varlen flashcheck:triton-varlen 8 "$seconds" &
  fuzz triton-varlen-reads_past_end 'flashcheck:triton-varlen~reads_past_end' 2 60 &
  fuzz split-kv torch:split-kv 4 "$seconds" &
  for bug in empty_split_nan lse_base2; do fuzz "split-kv-$bug" "torch:split-kv~$bug" 1 60 & done
  wait
elif [ "$part" = D ]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gpu.py > "$work/gpu_tests.txt" 2>&1
  fuzz triton-fp8 flashcheck:triton-fp8 6 "$seconds" &
  fuzz torch-fp8 torch:fp8 3 "$seconds" &
  fuzz triton-fp8-ignores_k_descale 'flashcheck:triton-fp8~ignores_k_descale' 1 60 &
  fuzz torch-fp8-ignores_k_descale 'torch:fp8~ignores_k_descale' 1 60 &
  wait
elif [ "$part" = E ]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_serving_gpu.py tests/gpu/test_fp8_gpu.py \
      > "$work/gpu_tests.txt" 2>&1
  fuzz triton-fp8 flashcheck:triton-fp8 4 "$seconds" &
  fuzz triton-paged flashcheck:triton-paged 4 "$seconds" &
  fuzz triton-split-kv flashcheck:triton-split-kv 3 "$seconds" &
  fuzz split-kv torch:split-kv 2 "$seconds" &
  for bug in triton-fp8~ignores_k_descale triton-paged~page_off_by_one triton-paged~ignores_cache_len \
      triton-split-kv~empty_split_nan triton-split-kv~lse_base2; do
    fuzz "${bug/\~/-}" "flashcheck:$bug" 1 60 &
  done
  wait
elif [ "$part" = F ]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gpu.py > "$work/gpu_tests.txt" 2>&1
  fuzz triton-fp8 flashcheck:triton-fp8 7 "$seconds" &
  fuzz triton-split-kv flashcheck:triton-split-kv 5 "$seconds" &
  fuzz triton-paged flashcheck:triton-paged 4 "$seconds" &
  wait
elif [ "$part" = G ]; then
  timeout 480 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_serving_gpu.py tests/gpu/test_fla_gpu.py \
      > "$work/gpu_tests.txt" 2>&1 &
  fuzz fla-decoding fla:attn_decoding 3 "$seconds" &
  fuzz split-kv torch:split-kv 4 "$seconds" &
  fuzz triton-split-kv flashcheck:triton-split-kv 3 "$seconds" &
  fuzz serving-paged 'torch:paged[backend=flash]' 2 "$seconds" --preset serving &
  fuzz serving-varlen 'torch:varlen[backend=flash]' 2 "$seconds" --preset serving &
  fuzz serving-decoding fla:attn_decoding 1 "$seconds" --preset serving &
  wait
elif [ "$part" = H ]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fla_gpu.py > "$work/gpu_tests.txt" 2>&1
  python3 reports/serving-2026-12-03/fla_decoding_probe.py > "$work/fla_decoding_probe.txt" 2>&1
  fuzz fla-decoding fla:attn_decoding 3 "$seconds" &
  fuzz split-kv torch:split-kv 10 "$seconds" &
  fuzz triton-split-kv flashcheck:triton-split-kv 2 "$seconds" &
  wait
  cat "$work/fla_decoding_probe.txt"
else
  for bug in reads_past_end shared_offsets; do fuzz "varlen-$bug" "torch:varlen~$bug[backend=flash]" 2 60 & done
  for bug in page_off_by_one ignores_cache_len; do fuzz "paged-$bug" "torch:paged~$bug[backend=flash]" 2 60 & done
  wait
  fuzz jagged torch:jagged 5 "$seconds" &
  fuzz flex-varlen torch:flex-varlen 5 "$seconds" &
  fuzz fla-varlen fla:parallel_attn-varlen 5 "$seconds" &
  wait
fi
cp "$work/machine.txt" "$out/"
tar -czf "$out/serving-$part.tgz" --exclude=.hypothesis --exclude='*found*' -C "$work" .
campaign_table
