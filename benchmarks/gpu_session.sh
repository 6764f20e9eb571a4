#!/usr/bin/env bash
# Every GPU measurement of a release in one call on a two-GPU host: two lanes side by side, each on its
# own GPU and half of the cores (so that each sees what a one-GPU, 16-core machine gives):
#   lane 0: the oracle against bare float64 attention (twice) and the oracle's GPU tests, campaign speed
#           (startup twice, cold and warm page cache; one process; --jobs 8), the example kernel
#           repository's GPU lane, then the other GPU tests until the time is up;
#   lane 1: the mutation suite, correct kernels and planted bugs (gpu_selftest.sh).
# On a one-GPU host both lanes share GPU 0 and every core (the speed figures then mean little).
# Everything is packed into OUTDIR/session.tgz; a short table of each part is printed last.
# Usage (repository root): bash benchmarks/gpu_session.sh OUTDIR [SELFTEST_SECONDS] [LIMIT_SECONDS]
set -uo pipefail
out=${1:-${OUT:-/tmp/flashcheck-session}}
selftest_s=${2:-450}
limit=${3:-560}  # lane 0 stops its GPU tests this many seconds after the start
root=$PWD
work=$(mktemp -d)
start=$(date +%s)
mkdir -p "$out"
export PYTHONPATH=$root/src PYTHONUNBUFFERED=1 work root start limit
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
cores=$(nproc)
source "$root/benchmarks/lanes.sh"
lane0() {
  for i in 1 2; do python3 benchmarks/bench_oracle.py --device cuda --repeats 7 --json "$work/oracle_$i.json" | tail -1; done \
      > "$work/oracle.txt" 2>&1
  gpu_tests oracle 120 tests/gpu/test_oracle_gpu.py
  python3 benchmarks/bench_campaign.py --device cuda --rows startup-flash,startup-flash,flash-1,flash-8 --seconds 60 \
      --json "$work/campaign.json" > "$work/campaign.txt" 2> "$work/campaign.log"
  (cd examples/kernel_repo && rm -rf .flashcheck &&
   PYTHONPATH=$root/src:$root/examples/kernel_repo/src timeout 240 python3 -m pytest -p flashcheck.plugin -p no:cacheprovider \
       --flashcheck-require-gpu --flashcheck-max-examples 200 -n 4 > "$work/kernel_repo.txt" 2>&1
   echo "kernel_repo exit $?" >> "$work/kernel_repo.txt"; cp .flashcheck/verdicts.json "$work/kernel_repo_verdicts.json")
  gpu_tests rest $((start + limit - $(date +%s))) tests/gpu --ignore=tests/gpu/test_oracle_gpu.py
}
gpu_tests() {  # NAME SECONDS PYTEST-ARGS...: GPU tests, cut at SECONDS
  local name=$1 seconds=$2; shift 2
  [ "$seconds" -gt 20 ] || { echo "not run: no time left" > "$work/gpu_tests_$name.txt"; return; }
  timeout "$seconds" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 4 "$@" > "$work/gpu_tests_$name.txt" 2>&1
  echo "exit $?" >> "$work/gpu_tests_$name.txt"
}
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'GPUs', torch.cuda.device_count(), 'cores', $cores)" | tee "$work/machine.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$work/machine.txt" 2>&1
pin 0 bash -c "$(declare -f lane0 gpu_tests); lane0" &
pin 1 bash benchmarks/gpu_selftest.sh "$work/selftest" 10 6 600 "$selftest_s" > "$work/selftest.txt" 2>&1 &
wait
tar czf "$out/session.tgz" -C "$work" .
{
  echo "== machine"; cat "$work/machine.txt"
  echo "== oracle+bound / bare float64 attention"; cat "$work/oracle.txt"
  echo "== campaigns"; cat "$work/campaign.txt"
  echo "== examples/kernel_repo, GPU lane"; grep -E "flashcheck|passed|failed|exit" "$work/kernel_repo.txt" | tail -8
  for f in "$work"/gpu_tests_*.txt; do echo "== GPU tests: $(basename "$f")"; tail -3 "$f"; done
  echo "== self-test"; cat "$work/selftest.txt"
} | tee "$out/summary.txt"
