#!/usr/bin/env bash
# The mutation suite on a CUDA machine in one call: the correct kernels (detection must give no BUG and
# no SUSPICIOUS; a case one fails is saved to OUTDIR/corpus-correct as it is found) and every planted bug
# (each must get BUG), side by side in two self-tests whose rows
# spread over worker processes (--jobs) and the visible GPUs, both stopped in time by a deadline. Rows run
# in chunks of FLASHCHECK_CHUNK cases (default 50) handed out round-robin, so every worker stays busy and
# the deadline cuts every row alike (a planted bug's first chunk holds 12 cases, later ones run only while
# it is not caught); the rows are the same whatever --jobs and --chunk are.
# FLASHCHECK_BACKWARD=1 runs the backward pass's self-test (selftest --backward) instead.
# FLASHCHECK_CORRECT_ROWS and FLASHCHECK_BUG_ROWS choose the two self-tests' rows as selftest arguments, quoted
# as in a shell (default: --variants correct, --variants bugs; benchmarks/gpu_variants.sh sets them).
# Usage (repository root): bash benchmarks/gpu_selftest.sh OUTDIR [CORRECT_JOBS] [BUG_JOBS] [CASES] [SECONDS]
set -uo pipefail
out=${1:-${OUT:-/tmp/flashcheck-selftest}}
correct_jobs=${2:-10}
bug_jobs=${3:-6}
cases=${4:-520}
seconds=${5:-480}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'GPUs', torch.cuda.device_count())"
run() { local which=$1 jobs=$2 rows
  eval "rows=($3)"
  python3 -m flashcheck.cli selftest ${FLASHCHECK_BACKWARD:+--backward} --device cuda "${rows[@]}" --jobs "$jobs" --max-n 1024 --head-dims 64,128 \
      --seed "${FLASHCHECK_SEED:-0}" --cases "$cases" --bug-cases "${FLASHCHECK_BUG_CASES:-60}" --time-budget "$seconds" \
      --chunk "${FLASHCHECK_CHUNK:-50}" --corpus "$out/corpus-$which" \
      --json "$out/selftest_$which.json" > "$out/selftest_$which.txt" 2> "$out/selftest_$which.err"
  echo "selftest $which exit $?" >> "$out/selftest_$which.txt"; }
run correct "$correct_jobs" "${FLASHCHECK_CORRECT_ROWS:---variants correct}" &
run bugs "$bug_jobs" "${FLASHCHECK_BUG_ROWS:---variants bugs}" &
wait
python3 -m flashcheck.cli selftest --table "$out"/selftest_correct.json "$out"/selftest_bugs.json > "$out/selftest_table.txt"
grep "exit" "$out"/selftest_correct.txt "$out"/selftest_bugs.txt
tail -40 "$out/selftest_table.txt"
