#!/usr/bin/env bash
# The attention variants on a CUDA machine in one call (benchmarks/gpu_selftest.sh on other rows):
# flashcheck:triton's correct kernel on soft-capped, windowed, chunked and sink cases (no BUG, no SUSPICIOUS
# may come out), and every planted bug of the variants that flashcheck judges (each must get BUG).
# FLASHCHECK_BACKWARD=1 runs the backward pass's (selftest --backward) instead.
# Usage (repository root): bash benchmarks/gpu_variants.sh OUTDIR [CORRECT_JOBS] [BUG_JOBS] [CASES] [SECONDS]
set -uo pipefail
FLASHCHECK_BUG_ROWS=$(python3 -c "
from flashcheck.selftest.subjects import variants
import os
rows = variants('cuda', which='bugs', backward=bool(os.environ.get('FLASHCHECK_BACKWARD')))
print(' '.join('--variant ' + v.name for v in rows if v.features))")
export FLASHCHECK_BUG_ROWS
export FLASHCHECK_CORRECT_ROWS="--variant 'triton[32x32] variants'"
exec bash "$(dirname "$0")/gpu_selftest.sh" "${1:-${OUT:-/tmp/flashcheck-variants}}" "${2:-10}" "${3:-6}" "${4:-2800}" "${5:-420}"
