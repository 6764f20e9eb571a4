#!/usr/bin/env bash
# One device call: every GPU test, the GPU self-test and the GPU benchmarks; short tables last.
# Usage (on a CUDA machine, repository root): bash benchmarks/gpu_suite.sh [OUTDIR] [SELFTEST_CASES]
set -uo pipefail
out=${1:-${OUT:-/tmp/flashcheck-gpu}}
cases=${2:-400}
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, torch.cuda.get_device_name())"
python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider -rfE 2>&1 | tee "$out/gpu_tests.log" | tail -8
python3 -m flashcheck.cli selftest --device cuda --cases "$cases" --bug-cases 60 --max-n 1024 \
    --json "$out/selftest_gpu.json" > "$out/selftest_gpu.txt" 2> "$out/selftest_gpu.err"
python3 benchmarks/bench_oracle.py --device cuda --repeats 5 --json "$out/bench_oracle_gpu.json"
tail -12 "$out/selftest_gpu.txt"
