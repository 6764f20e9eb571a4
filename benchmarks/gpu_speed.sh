#!/usr/bin/env bash
# Campaign speed on a CUDA machine, in one call: the oracle against bare float64 attention, the cost of
# one case part by part (with the launches of the oracle and budget), and campaign throughput (one
# process, --jobs, Triton from a cold and a warm cache). With BEFORE=path/to/older/src the same
# measurements run on that checkout too, in the same call, for before/after ratios.
# Usage (repository root): bash benchmarks/gpu_speed.sh OUTDIR [ROWS] [SECONDS]
set -uo pipefail
out=${1:-${OUT:-/tmp/flashcheck-speed}}
rows=${2:-startup-flash,flash-1,flash-8,triton-8-cold,triton-8-warm}
seconds=${3:-40}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
now=$PWD/src
python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, torch.cuda.get_device_name(), 'GPUs', torch.cuda.device_count())"
labels=("now=$now"); [ -n "${BEFORE:-}" ] && labels+=("before=$BEFORE")
for pair in "${labels[@]}"; do label=${pair%%=*}; src=${pair#*=}
  PYTHONPATH=$src python3 benchmarks/bench_oracle.py --device cuda --json "$out/oracle_$label.json" | tail -1 | sed "s/^/$label /"
  for k in ${PROFILE_KERNELS:-torch:flash flashcheck:triton}; do
    PYTHONPATH=$src python3 benchmarks/profile_case.py --device cuda --kernel "$k" --cases "${PROFILE_CASES:-100}" --label "$label" \
        --json "$out/profile_${label}_${k//[^a-z]/_}.json" 2>/dev/null | tail -1
  done
done
src_args=(); [ -n "${BEFORE:-}" ] && src_args=(--src "before=$BEFORE")
# Rows that need --jobs are left out of the older checkout's run by bench_campaign itself.
python3 benchmarks/bench_campaign.py --device cuda --rows "$rows" --seconds "$seconds" "${src_args[@]}" \
    --json "$out/campaign.json" 2> "$out/campaign.log"
