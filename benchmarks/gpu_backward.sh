#!/usr/bin/env bash
# The backward pass on a CUDA host in one call, in two lanes side by side (one GPU each on a two-GPU host):
#   lane 0: the oracle's gradients on the GPU against the CPU's (same numbers within both bounds), the
#           Triton backward's GPU tests and those of PyTorch's backward defects, then a timed `fuzz --backward` campaign on each kernel of $KERNELS;
#   lane 1: the backward self-test (gpu_selftest.sh with FLASHCHECK_BACKWARD=1): the correct kernels'
#           gradients (no BUG, no SUSPICIOUS) and every planted backward bug (each must get BUG).
# Everything is packed into OUTDIR/backward.tgz; a short table of each part is printed last.
# Usage (repository root): bash benchmarks/gpu_backward.sh OUTDIR [CAMPAIGN_SECONDS] [SELFTEST_SECONDS] [CASES]
set -uo pipefail
out=${1:-${OUT:-/tmp/flashcheck-backward}}
seconds=${2:-40}
selftest_s=${3:-420}
cases=${4:-700}
kernels=${KERNELS:-torch:math torch:flash torch:efficient torch:cudnn flashcheck:triton}
root=$PWD
work=$(mktemp -d)
mkdir -p "$out"
export PYTHONPATH=$root/src PYTHONUNBUFFERED=1
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
cores=$(nproc)
source "$root/benchmarks/lanes.sh"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuDNN', torch.backends.cudnn.version(), torch.cuda.get_device_name(), 'GPUs', torch.cuda.device_count())" | tee "$work/machine.txt"
oracle_gpu_vs_cpu() {
python3 - <<'PY'
import torch
from flashcheck.numerics.gradients import GRADIENTS, reference_gradients
g = torch.Generator().manual_seed(0)
worst = 0.0
for dtype in (torch.float16, torch.bfloat16, torch.float32):
    q = torch.randn(2, 8, 300, 64, generator=g).to(dtype); k, v = (torch.randn(2, 2, 257, 64, generator=g).to(dtype) for _ in range(2))
    do = torch.randn(2, 8, 300, 64, generator=g).to(dtype)
    cpu = reference_gradients(q, k, v, do, scale=0.125, causal="bottom_right")
    gpu = reference_gradients(*(t.cuda() for t in (q, k, v, do)), scale=0.125, causal="bottom_right")
    for n in GRADIENTS:
        r = float(((gpu[n].cpu() - cpu[n]).abs() / (gpu.bound[n].cpu() + cpu.bound[n])).max())
        worst = max(worst, r)
print(f"oracle gradients, GPU against CPU: worst |difference| / (sum of bounds) = {worst:.3g} (must be <= 1)")
PY
}
campaign() {  # KERNEL: a timed fuzz --backward campaign, its findings saved as they are found
  local k=$1 name=${1//[:\[\]=,]/_}
  python3 -m flashcheck.cli fuzz "$k" --backward --device cuda --preset adversarial --seed 1 --keep-going \
      --max-examples 100000 --time-budget "$seconds" --corpus "$work/corpus-$name" \
      --json "$work/fuzz_$name.json" --no-progress > "$work/fuzz_$name.txt" 2>&1
  echo "== $k (exit $?)"; grep -E "^flashcheck fuzz|cases in|bf16:|fp16:|fp32:|failing cases|BUG |      [a-z]" "$work/fuzz_$name.txt" | head -16
}
lane0() {
  oracle_gpu_vs_cpu > "$work/oracle_gpu_vs_cpu.txt" 2>&1
  timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 4 tests/gpu/test_triton_backward_gpu.py \
      tests/gpu/test_sdpa_backward_defects_gpu.py > "$work/gpu_tests.txt" 2>&1
  echo "exit $?" >> "$work/gpu_tests.txt"
  for k in $kernels; do campaign "$k"; done > "$work/campaigns.txt"
}
export -f oracle_gpu_vs_cpu campaign lane0
export work seconds kernels
pin 0 bash -c lane0 &
pin 1 env FLASHCHECK_BACKWARD=1 bash benchmarks/gpu_selftest.sh "$work/selftest" 10 6 "$cases" "$selftest_s" \
    > "$work/selftest.txt" 2>&1 &
wait
tar czf "$out/backward.tgz" -C "$work" .
{
  echo "== machine"; cat "$work/machine.txt"
  echo "== oracle"; cat "$work/oracle_gpu_vs_cpu.txt"
  echo "== Triton backward GPU tests"; tail -4 "$work/gpu_tests.txt"
  echo "== campaigns"; cat "$work/campaigns.txt"
  echo "== backward self-test"; tail -16 "$work/selftest/selftest_table.txt" 2>/dev/null || tail -5 "$work/selftest.txt"
} | tee "$out/summary.txt"
