#!/usr/bin/env bash
# Adversarial campaigns on the third-party kernels that take attention variants, on a CUDA host in one call:
# FlexAttention (soft-cap, ALiBi, bias, window, chunk, sinks), flash-linear-attention's parallel_attn
# (window, sinks; needs fla-core: wheels in .whl/ are installed first when fla is missing), and the SDPA
# backends that take a float bias (math, efficient), forward and backward, PAIRS campaigns at a time.
# Every finding is saved to OUTDIR/corpus-* the moment it is found; a short table is printed last.
# Usage (repository root): bash benchmarks/gpu_variant_campaigns.sh OUTDIR [SECONDS] [JOBS] [PAIRS]
set -uo pipefail
out=${1:-${OUT:-/tmp/flashcheck-variant-campaigns}}
seconds=${2:-60}
jobs=${3:-4}
pairs=${4:-3}
kernels=${KERNELS:-torch:flex fla:parallel_attn torch:efficient torch:math}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
source "$(dirname "$0")/fla_site.sh"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
torch.cuda.get_device_name())" | tee "$out/machine.txt"
campaign() {  # KERNEL PASS: one timed campaign (PASS: forward or backward)
  local k=$1 pass=$2 name=${1//[:\[\]=,]/_}_${2#--}
  python3 -m flashcheck.cli fuzz "$k" ${pass/forward/} --device cuda --preset adversarial --seed 1 --keep-going \
      --max-examples 100000 --time-budget "$seconds" --jobs "$jobs" --corpus "$out/corpus-$name" \
      --json "$out/fuzz_$name.json" --no-progress > "$out/fuzz_$name.txt" 2>&1
  echo "exit $?" >> "$out/fuzz_$name.txt"
}
running=0
for k in $kernels; do
  for pass in forward --backward; do
    campaign "$k" "$pass" &
    running=$((running + 1))
    if [ "$running" -ge "$pairs" ]; then wait -n; running=$((running - 1)); fi
  done
done
wait
for f in "$out"/fuzz_*.txt; do
  echo "== $(basename "$f" .txt)"
  grep -E "^flashcheck fuzz|cases in|bf16:|fp16:|fp32:|distinct|BUG |SUSPICIOUS |never judged:|exit" "$f" | head -14
done | tee "$out/summary.txt"
