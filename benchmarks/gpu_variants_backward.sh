#!/usr/bin/env bash
# The variants' backward H200 evidence and a long FlexAttention campaign in one call (under 10 minutes):
#   - the backward self-test's correct row `triton[32x32] variants` (no BUG, no SUSPICIOUS may come out),
#     beside its planted variant bugs (each must get BUG), for SECONDS;
#   - an adversarial forward campaign on torch:flex for FLEX_SECONDS, from the start (its compiles are slow);
#   - fla's one-step outliers with Triton's FP fusion on and off (benchmarks/fla_fp_fusion.py), the control.
# Failing cases and findings go to OUTDIR/corpus-* the moment they are found; everything is packed into
# OUTDIR/variants.tgz; a short table is printed last.
# Usage (repository root): bash benchmarks/gpu_variants_backward.sh OUTDIR [CASES_PER_DTYPE] [SECONDS] [FLEX_SECONDS]
set -uo pipefail
out=${1:-${OUT:-/tmp/flashcheck-variants-backward}}
cases=${2:-1100}
seconds=${3:-240}
flex_seconds=${4:-470}
work=$(mktemp -d)
mkdir -p "$out"
source "$(dirname "$0")/gpu_setup.sh"
selftest() {  # NAME JOBS SELFTEST-ARGUMENTS...: one timed backward self-test, its table, JSON and corpus
  local name=$1 jobs=$2; shift 2
  python3 -m flashcheck.cli selftest --device cuda --backward --jobs "$jobs" --max-n 1024 --head-dims 64,128 \
      --seed 0 --cases "$cases" --bug-cases 60 --time-budget "$seconds" --corpus "$work/corpus-$name" \
      --json "$work/$name.json" "$@" > "$work/$name.txt" 2> "$work/$name.err"
  echo "selftest $name exit $?" >> "$work/$name.txt"
}
bug_rows=$(python3 -c "
from flashcheck.selftest.subjects import variants
print(' '.join('--variant ' + v.name for v in variants('cuda', which='bugs', backward=True) if v.features))")
python3 -m flashcheck.cli fuzz torch:flex --device cuda --preset adversarial --seed 1 --keep-going \
    --max-examples 100000 --time-budget "$flex_seconds" --jobs 6 --corpus "$work/corpus-flex" \
    --json "$work/fuzz_flex.json" --no-progress > "$work/fuzz_flex.txt" 2>&1 &
flex=$!
selftest backward_correct 7 --variant 'triton[32x32] variants' &
correct=$!
# shellcheck disable=SC2086 # one --variant NAME pair per word
selftest backward_bugs 3 $bug_rows &
bugs=$!
case=$(ls reports/variants-2026-12-02-run2/h200/fla-cases/*reordering_outlier*.json)
for fusion in default 0; do
  if [ "$fusion" = default ]; then python3 benchmarks/fla_fp_fusion.py "$case"
  else TRITON_DEFAULT_FP_FUSION=0 python3 benchmarks/fla_fp_fusion.py "$case"; fi
done > "$work/fla_fp_fusion.txt" 2>&1
wait "$correct" "$bugs"
tar -czf "$out/variants.tgz" -C "$work" .  # the self-tests' results, safe before Flex ends
wait "$flex"
echo "exit $?" >> "$work/fuzz_flex.txt"
tar -czf "$out/variants.tgz" -C "$work" .
for name in backward_correct backward_bugs; do
  echo "== $name"; grep -E "exit|caught|false alarms|correct variants|internal errors|time budget" "$work/$name.txt"
done
echo "== fla_fp_fusion"; cat "$work/fla_fp_fusion.txt"
echo "== flex"; grep -E "cases in|bf16:|fp16:|fp32:|distinct|BUG |SUSPICIOUS |never judged:|exit|time" "$work/fuzz_flex.txt" | head -20
