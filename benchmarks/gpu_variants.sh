#!/usr/bin/env bash
# The attention variants on a CUDA machine in one call: flashcheck:triton's correct kernel on soft-capped,
# windowed, chunked and sink cases (no BUG, no SUSPICIOUS may come out), and every planted bug of the
# variants (each must get BUG), as two self-tests side by side, stopped in time by a deadline.
# FLASHCHECK_BACKWARD=1 runs the backward pass's (selftest --backward) instead.
# Usage (repository root): bash benchmarks/gpu_variants.sh OUTDIR [CORRECT_JOBS] [BUG_JOBS] [CASES] [SECONDS]
set -uo pipefail
out=${1:-${OUT:-/tmp/flashcheck-variants}}
correct_jobs=${2:-10}
bug_jobs=${3:-6}
cases=${4:-2800}
seconds=${5:-420}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'GPUs', torch.cuda.device_count())"
bugs=$(python3 -c "
from flashcheck.kernels.triton.planted_variants import VARIANT_BACKWARD_MUTANTS, VARIANT_MUTANTS
import os
chosen = VARIANT_BACKWARD_MUTANTS if os.environ.get('FLASHCHECK_BACKWARD') else VARIANT_MUTANTS
print(' '.join('--variant ' + m.name for m in chosen))")
run() { local which=$1 jobs=$2; shift 2
  python3 -m flashcheck.cli selftest ${FLASHCHECK_BACKWARD:+--backward} --device cuda "$@" --jobs "$jobs" --max-n 1024 \
      --head-dims 64,128 --seed "${FLASHCHECK_SEED:-0}" --cases "$cases" --bug-cases "${FLASHCHECK_BUG_CASES:-60}" \
      --time-budget "$seconds" --chunk "${FLASHCHECK_CHUNK:-50}" \
      --json "$out/selftest_$which.json" > "$out/selftest_$which.txt" 2> "$out/selftest_$which.err"
  echo "selftest $which exit $?" >> "$out/selftest_$which.txt"; }
run correct "$correct_jobs" --variant "triton[32x32] variants" &
# shellcheck disable=SC2086
run bugs "$bug_jobs" $bugs &
wait
python3 -m flashcheck.cli selftest --table "$out"/selftest_correct.json "$out"/selftest_bugs.json > "$out/selftest_table.txt"
grep "exit" "$out"/selftest_correct.txt "$out"/selftest_bugs.txt
tail -40 "$out/selftest_table.txt"
