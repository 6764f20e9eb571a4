#!/usr/bin/env bash
# GPU work in parts that each fit one 10-minute device call; short tables last.
# Usage (on a CUDA machine, repository root):
#   bash benchmarks/gpu_suite.sh tests    OUTDIR         # every GPU-marked test (~7 min, flex compiles)
#   bash benchmarks/gpu_suite.sh selftest OUTDIR [CASES] [all|correct|bugs]  # mutation suite, bf16/fp16/fp32
#   bash benchmarks/gpu_suite.sh bench    OUTDIR         # oracle benchmark and campaign throughput
set -uo pipefail
part=${1:?tests, selftest or bench}
out=${2:-${OUT:-/tmp/flashcheck-gpu}}
cases=${3:-500}
which=${4:-all}  # selftest: all, correct or bugs (to split it over two calls)
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, torch.cuda.get_device_name())"
case "$part" in
  tests)
    python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider -rfE 2>&1 | tee "$out/gpu_tests.log" | tail -15 ;;
  selftest)
    python3 -m flashcheck.cli selftest --device cuda --cases "$cases" --bug-cases 60 --max-n 1024 --variants "$which" --head-dims 64,128 \
        --json "$out/selftest_gpu_$which.json" > "$out/selftest_gpu_$which.txt" 2> "$out/selftest_gpu_$which.err"
    tail -12 "$out/selftest_gpu_$which.txt" ;;
  bench)
    python3 benchmarks/bench_oracle.py --device cuda --repeats 5 --json "$out/bench_oracle_gpu.json"
    for preset in smoke adversarial; do
      python3 -m flashcheck.cli fuzz flashcheck:triton --device cuda --preset "$preset" --seed 1 --max-examples 200 \
          --time-budget 150 --corpus "$out/corpus-$preset" --json "$out/fuzz_$preset.json" --no-progress | tail -6
    done ;;
  *) echo "unknown part: $part" >&2; exit 2 ;;
esac
