#!/usr/bin/env bash
# GPU work in parts that each fit one 10-minute call on a 16-core GPU host; short tables last.
# Everything a part writes is packed into OUTDIR/gpu-<part>.tgz (plus its short tables beside it).
# Usage (on a CUDA machine, repository root):
#   bash benchmarks/gpu_suite.sh main      OUTDIR [CASES]   # oracle benchmark, then in parallel: every GPU test
#                                                           # and the mutation suite (bf16/fp16/fp32), sharded
#   bash benchmarks/gpu_suite.sh campaigns OUTDIR [VARIANT...]  # campaign throughput (alone on the GPU), the
#                                                           # long-context preset, and selftest rows named here
# FLASHCHECK_GPU_LIMIT (seconds, default 500) stops each process of a part in time; the selftest JSON keeps
# every row a stopped shard finished, and `flashcheck selftest --table` prints the shards as one table.
set -uo pipefail
part=${1:?main or campaigns}
out=${2:-${OUT:-/tmp/flashcheck-gpu}}
shift 2 || true
limit=${FLASHCHECK_GPU_LIMIT:-500}
work=$(mktemp -d)
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, torch.cuda.get_device_name())"
fc() { python3 -m flashcheck.cli "$@"; }
# One selftest shard in the background: NAME, then selftest options.
shard() { local name=$1; shift
  timeout "$limit" python3 -m flashcheck.cli selftest --device cuda --max-n 1024 --head-dims 64,128 \
      --json "$work/selftest_$name.json" "$@" > "$work/selftest_$name.txt" 2> "$work/selftest_$name.err" & }
names() { python3 -c "from flashcheck.selftest import variants; print('\n'.join(v.name for v in variants('cuda', which='$1')))"; }
pack() {
  ls "$work"/selftest_*.json > /dev/null 2>&1 && fc selftest --table "$work"/selftest_*.json > "$work/selftest_gpu.txt"
  tar czf "$out/gpu-$part.tgz" -C "$work" .
  for f in selftest_gpu.txt gpu_tests.txt bench.txt; do [ -f "$work/$f" ] && cp "$work/$f" "$out/"; done
}
case "$part" in
  main)
    cases=${1:-500}
    # The benchmark first, alone on the GPU, so its timings are clean.
    python3 benchmarks/bench_oracle.py --device cuda --repeats 5 --json "$work/bench_oracle_gpu.json" 2>&1 | tee "$work/bench.txt"
    (timeout "$limit" python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider -rfE -n 4 > "$work/gpu_tests.txt" 2>&1) &
    i=0
    while read -r v; do i=$((i + 1)); shard "correct$i" --variants correct --variant "$v" --cases "$cases"; done < <(names correct)
    # Planted bugs in seven shards, round robin.
    mapfile -t bugs < <(names bugs)
    for s in 0 1 2 3 4 5 6; do
      args=(); for ((j = s; j < ${#bugs[@]}; j += 7)); do args+=(--variant "${bugs[j]}"); done
      shard "bugs$s" --variants bugs --bug-cases 60 "${args[@]}"
    done
    wait
    pack
    tail -4 "$work/gpu_tests.txt"; tail -8 "$out/selftest_gpu.txt" ;;
  campaigns)
    for preset in smoke adversarial; do
      fc fuzz flashcheck:triton --device cuda --preset "$preset" --seed 1 --max-examples 400 --time-budget 100 \
          --corpus "$work/corpus-$preset" --json "$work/fuzz_$preset.json" --no-progress 2>&1 | tail -8 | tee -a "$work/bench.txt"
    done
    fc fuzz flashcheck:triton --device cuda --preset long-context --seed 1 --time-budget 120 \
        --corpus "$work/corpus-long" --json "$work/fuzz_long.json" --no-progress 2>&1 | tail -8 | tee -a "$work/bench.txt"
    i=0
    for v in "$@"; do i=$((i + 1)); shard "rest$i" --variant "$v" --cases 500 --bug-cases 60; done
    wait
    pack ;;
  *) echo "unknown part: $part" >&2; exit 2 ;;
esac
