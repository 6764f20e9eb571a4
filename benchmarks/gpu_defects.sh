#!/usr/bin/env bash
# The defect models' GPU evidence in one call (SECONDS and a minute): the table of fits (every model's planted bug in
# the compiled Triton kernel, and the real defects classified in reports/: PyTorch's SDPA backends, cuDNN,
# fla-core's decoding step and SGLang's MLA decode where their wheels are carried in .whl/), beside the sweep of
# correct kernels' cases nearest their budget (each kernel its own process, SECONDS each): no model may name one.
# Usage (repository root): bash benchmarks/gpu_defects.sh OUTDIR [SECONDS]
set -uo pipefail
out=${1:?OUTDIR} seconds=${2:-300}
mkdir -p "$out"
work=$out
source "$(dirname "$0")/gpu_setup.sh"
for kernel in torch:flash torch:efficient; do
  name=${kernel//:/-}
  timeout $((seconds + 30)) python3 benchmarks/defect_sweep.py --kernel "$kernel" --device cuda --cases 3000 \
      --top 800 --seconds "$seconds" --json "$out/sweep-$name.json" > "$out/sweep-$name.txt" 2>&1 &
done
timeout 200 python3 benchmarks/defect_table.py --device cuda > "$out/table.txt" 2>&1
wait
cat "$out/machine.txt" "$out/table.txt"
tail -n 1 "$out"/sweep-*.txt
