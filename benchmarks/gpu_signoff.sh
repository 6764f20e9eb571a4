#!/usr/bin/env bash
# A release sign-off on a CUDA host in one call: the six built-in kernels, forward and backward, every
# dtype each supports, --jobs spread over the visible GPUs. The report folder is packed into
# OUTDIR/report.tgz (without its corpus) and OUTDIR/corpus.tgz (the saved cases, less the .npz files over
# 1 MB, listed in corpus-left-out.txt: a file that comes back from a remote runner is limited in size).
# Usage (repository root): [STOP_AT=S] [MIN_REGIME_CASES=N] [SEED=S] bash benchmarks/gpu_signoff.sh OUTDIR [SECONDS] [JOBS]
#        [MAX_EXAMPLES] [KERNELS...]
set -uo pipefail
out=${1:-${OUT:-/tmp/flashcheck-signoff}}
seconds=${2:-400}
jobs=${3:-16}
max=${4:-3000}
shift $(( $# > 4 ? 4 : $# ))
# The slowest last: they share what the fast ones leave of the time budget (flex compiles per shape).
kernels=${*:-torch:math torch:flash torch:efficient torch:cudnn flashcheck:triton torch:flex}
stop_at=${STOP_AT:-0}  # seconds after which the sign-off is interrupted (its report still written); 0: never
min_regime=${MIN_REGIME_CASES:-10}  # --min-regime-cases
device=${DEVICE:-cuda}
report=$(mktemp -d)/signoff
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
# shellcheck disable=SC2086
timeout -s INT "${stop_at}" python3 -m flashcheck.cli signoff $kernels --backward --device "$device" --preset signoff --jobs "$jobs" \
  --time-budget "$seconds" --max-examples "$max" --min-regime-cases "$min_regime" --seed "${SEED:-20261201}" \
  --out "$report" 2>&1 | tee "$out/signoff.log"
status=${PIPESTATUS[0]}
(cd "$report" && find corpus -name '*.npz' -size +1M | sort > corpus-left-out.txt)
(cd "$report" && xargs -r rm -f < corpus-left-out.txt)
find "$report/corpus" -name '.hypothesis' -type d -prune -exec rm -rf {} + 2>/dev/null
tar czf "$out/report.tgz" -C "$(dirname "$report")" --exclude=signoff/corpus signoff
tar czf "$out/corpus.tgz" -C "$(dirname "$report")" signoff/corpus
ls -la "$out"
echo "signoff exit status: $status"
