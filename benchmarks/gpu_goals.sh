#!/usr/bin/env bash
# The throughput goals in one call (under 10 minutes), this checkout and BEFORE (an older checkout's src/)
# side by side: torch:flash on the adversarial preset in one process (kernel in a worker, the default), with
# --jobs 16 forward and backward, and the long-context preset with --jobs 4, ROW_SECONDS each (default 25),
# through benchmarks/bench_campaign.py; then the oracle and its bound against a bare float64 attention
# (benchmarks/bench_oracle.py, H = 16, N = 4096, D = 128), and the cost of a case as its work grows
# (benchmarks/bench_work.py, at most WORK_SECONDS, default 150). Tables last; JSON rows in OUTDIR.
# Usage (repository root): [BEFORE=path/to/src] bash benchmarks/gpu_goals.sh OUTDIR [ROW_SECONDS]
set -uo pipefail
out=${1:-${OUT:-/tmp/flashcheck-goals}}
seconds=${2:-25}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
torch.cuda.get_device_name())" | tee "$out/machine.txt"
before=(); [ -n "${BEFORE:-}" ] && before=(--src "before=$BEFORE")
python3 benchmarks/bench_campaign.py --device cuda --rows flash-1-worker,flash-16,flash-16-backward,longctx-4 \
    --seconds "$seconds" "${before[@]}" --json "$out/goals.json" > "$out/goals.txt" 2> "$out/goals.log"
python3 benchmarks/bench_oracle.py --device cuda --json "$out/oracle.json" > "$out/oracle.txt" 2>&1
timeout "${WORK_SECONDS:-150}" python3 benchmarks/bench_work.py --device cuda --json "$out/work.json" > "$out/work.txt" 2>&1
cat "$out/work.txt" "$out/goals.txt" "$out/oracle.txt"
