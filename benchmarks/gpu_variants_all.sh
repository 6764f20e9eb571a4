#!/usr/bin/env bash
# The attention variants' H200 evidence in one call (under 10 minutes), in two phases that keep 16 cores busy:
#   1. the forward self-test's correct row `triton[32x32] variants` (no BUG, no SUSPICIOUS may come out), beside
#      the backward self-test's planted variant bugs (each must get BUG);
#   2. the backward self-test's correct row, beside adversarial campaigns on FlexAttention and fla-core's
#      parallel_attn (benchmarks/gpu_variant_campaigns.sh), forward and backward.
# A correct row's failing cases go to OUTDIR/corpus-*, as do the campaigns' findings, the moment they are found.
# Usage (repository root): bash benchmarks/gpu_variants_all.sh OUTDIR [CASES_PER_DTYPE] [SECONDS_PER_PHASE]
set -uo pipefail
out=${1:-${OUT:-/tmp/flashcheck-variants-all}}
cases=${2:-1000}
seconds=${3:-160}
here=$(dirname "$0")
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
selftest() {  # NAME JOBS SELFTEST-ARGUMENTS...: one timed self-test, its table, JSON and corpus under OUTDIR
  local name=$1 jobs=$2; shift 2
  python3 -m flashcheck.cli selftest --device cuda --jobs "$jobs" --max-n 1024 --head-dims 64,128 --seed 0 \
      --cases "$cases" --bug-cases 60 --time-budget "$seconds" --corpus "$out/corpus-$name" \
      --json "$out/$name.json" "$@" > "$out/$name.txt" 2> "$out/$name.err"
  echo "selftest $name exit $?" >> "$out/$name.txt"
}
bug_rows=$(python3 -c "
from flashcheck.selftest.subjects import variants
print(' '.join('--variant ' + v.name for v in variants('cuda', which='bugs', backward=True) if v.features))")
# shellcheck disable=SC2086 # one --variant NAME pair per word
selftest forward_correct 10 --variant 'triton[32x32] variants' &
selftest backward_bugs 6 --backward $bug_rows &
wait
selftest backward_correct 10 --backward --variant 'triton[32x32] variants' &
KERNELS="fla:parallel_attn torch:flex" bash "$here/gpu_variant_campaigns.sh" "$out/campaigns" $((seconds / 2 - 10)) 3 2 \
    > "$out/campaigns.log" 2>&1 &
wait
for name in forward_correct backward_bugs backward_correct; do
  echo "== $name"; grep -E "exit|caught|false alarms|correct variants|internal errors|time budget" "$out/$name.txt"
done
cat "$out/campaigns/summary.txt"
