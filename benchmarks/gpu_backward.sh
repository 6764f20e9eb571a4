#!/usr/bin/env bash
# The backward pass on a CUDA machine, in one short call: the float64 oracle's gradients on the GPU
# against the CPU's (same numbers within both bounds), then a timed `fuzz --backward` campaign on each
# differentiable PyTorch backend. Usage (repository root): bash benchmarks/gpu_backward.sh OUTDIR [SECONDS]
set -uo pipefail
out=${1:-${OUT:-/tmp/flashcheck-backward}}
seconds=${2:-40}
work=$(mktemp -d)
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 - <<'PY' | tee "$out/oracle_gpu_vs_cpu.txt"
import torch
from flashcheck.gradients import GRADIENTS, reference_gradients
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
for k in torch:math torch:flash torch:efficient torch:cudnn; do
  python3 -m flashcheck.cli fuzz "$k" --backward --device cuda --preset adversarial --seed 1 --keep-going \
      --max-examples 100000 --time-budget "$seconds" --corpus "$work/corpus-${k#torch:}" \
      --json "$work/fuzz_${k#torch:}.json" --no-progress > "$work/fuzz_${k#torch:}.txt" 2>&1
  echo "== $k (exit $?)"; grep -E "^flashcheck fuzz|cases in|bf16:|fp16:|fp32:|failing cases|BUG |      [a-z]" "$work/fuzz_${k#torch:}.txt" | head -14
done | tee "$out/summary.txt"
tar czf "$out/backward.tgz" -C "$work" .  # summaries, logs and the saved cases
