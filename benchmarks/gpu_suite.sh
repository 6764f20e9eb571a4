#!/usr/bin/env bash
# One device call: every GPU test, then the GPU benchmarks; a short table last.
# Usage (on a CUDA machine, repository root): bash benchmarks/gpu_suite.sh [OUTDIR]
set -uo pipefail
out=${1:-${OUT:-/tmp/flashcheck-gpu}}
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, torch.cuda.get_device_name())"
python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider -rfE 2>&1 | tee "$out/gpu_tests.log" | tail -25
python3 benchmarks/bench_oracle.py --device cuda --repeats 5 --json "$out/bench_oracle_gpu.json"
