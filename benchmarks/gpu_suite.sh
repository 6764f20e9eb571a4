#!/usr/bin/env bash
# GPU work in parts that each fit one 10-minute call on a 16-core GPU host; short tables last.
# Everything a part writes is packed into OUTDIR/gpu-<part>.tgz (plus its short tables beside it).
# Usage (on a CUDA machine, repository root):
#   bash benchmarks/gpu_suite.sh sweep OUTDIR [CASES]  # every GPU test, and the correct variants of the mutation
#                                                      # suite (bf16/fp16/fp32), one process per variant and dtype
#   bash benchmarks/gpu_suite.sh bugs  OUTDIR [VARIANT:DTYPE...]  # campaign throughput (alone on the GPU),
#                                                      # then side by side: every GPU test, the planted bugs in
#                                                      # shards, campaigns (long-context; PyTorch's fused
#                                                      # backends) and any extra selftest rows named
# FLASHCHECK_GPU_TESTS=0 leaves the GPU tests out (more of the machine for the self-test), FLASHCHECK_SEED
# (default 0) seeds the self-test's cases.
# FLASHCHECK_GPU_LIMIT (seconds, default 480) bounds each process of a part; selftest shards stop their rows
# in time (--time-budget), the JSON keeps every finished row, and `flashcheck selftest --table` prints the
# shards as one table.
set -uo pipefail
part=${1:?sweep or bugs}
out=${2:-${OUT:-/tmp/flashcheck-gpu}}
shift 2 || true
limit=${FLASHCHECK_GPU_LIMIT:-480}
seed=${FLASHCHECK_SEED:-0}
work=$(mktemp -d)
mkdir -p "$out"
# Many processes share 16 cores: one thread each for their small CPU-side tensor work.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, torch.cuda.get_device_name())"
fc() { python3 -m flashcheck.cli "$@"; }
# One selftest shard in the background: NAME, then selftest options.
shard() { local name=$1; shift
  timeout "$limit" nice -n 5 python3 -m flashcheck.cli selftest --device cuda --max-n 1024 --head-dims 64,128 --seed "$seed" \
      --time-budget $((limit - 40)) \
      --json "$work/selftest_$name.json" "$@" > "$work/selftest_$name.txt" 2> "$work/selftest_$name.err" & }
gpu_tests() { [ "${FLASHCHECK_GPU_TESTS:-1}" = 0 ] && return
  (timeout "$limit" python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider -rfE -n 4 > "$work/gpu_tests.txt" 2>&1) & }
names() { python3 -c "from flashcheck.selftest.subjects import variants; print('\n'.join(v.name for v in variants('cuda', which='$1')))"; }
pack() {
  ls "$work"/selftest_*.json > /dev/null 2>&1 && fc selftest --table "$work"/selftest_*.json > "$work/selftest_gpu.txt"
  tar czf "$out/gpu-$part.tgz" --exclude='corpus-*/*.npz' -C "$work" .  # case JSONs describe the corpus; its arrays stay
  for f in selftest_gpu.txt gpu_tests.txt bench.txt fuzz_long.txt; do [ -f "$work/$f" ] && cp "$work/$f" "$out/"; done
}
case "$part" in
  sweep)
    cases=${1:-500}
    gpu_tests
    i=0
    for dtype in fp16 bf16 fp32; do
      while read -r v; do i=$((i + 1)); shard "correct$i" --variants correct --variant "$v" --dtype "$dtype" --cases "$cases"; done < <(names correct)
    done
    wait
    pack
    tail -4 "$work/gpu_tests.txt" 2>/dev/null; tail -8 "$out/selftest_gpu.txt" ;;
  bugs)
    # Throughput first, alone on the GPU.
    # --keep-going: a crash (a broken CUDA context among them) is saved and the campaign goes on.
    for preset in smoke adversarial; do
      fc fuzz flashcheck:triton --device cuda --preset "$preset" --seed 1 --max-examples 400 --time-budget 40 --keep-going \
          --corpus "$work/corpus-$preset" --json "$work/fuzz_$preset.json" --no-progress 2>&1 | tail -8 | tee -a "$work/bench.txt"
    done
    # Any crash the throughput runs found: its case (arrays too) and a replay with synchronous launches, then
    # under compute-sanitizer, so the failing access is named (in the background, beside the rest).
    (python3 - "$work" <<'PY'
import json, pathlib, sys
work = pathlib.Path(sys.argv[1])
for summary in sorted(work.glob("fuzz_*.json")):
    for f in json.loads(summary.read_text()).get("findings", []):
        if "crash" in f["kinds"]:
            print(f["path"])
PY
    ) > "$work/crash_cases.txt"
    (mkdir -p "$work/crashes"; i=0
     while read -r c; do i=$((i + 1)); stem=${c%.json}; stem=${stem%.npz}
       cp "$stem".* "$work/crashes/" 2>/dev/null
       CUDA_LAUNCH_BLOCKING=1 timeout 120 python3 -m flashcheck.cli replay "$stem" > "$work/crashes/replay$i.txt" 2>&1
       timeout 240 compute-sanitizer --tool memcheck --print-limit 20 python3 -m flashcheck.cli replay "$stem" \
           > "$work/crashes/sanitizer$i.txt" 2>&1
     done < "$work/crash_cases.txt") &
    # Then, side by side: every GPU test, the planted bugs in shards, a long-context campaign, and
    # keep-going campaigns on PyTorch's fused backends (their findings, by regime, in the JSON).
    gpu_tests
    (timeout "$limit" python3 -m flashcheck.cli fuzz flashcheck:triton --device cuda --preset long-context --seed 1 \
        --time-budget $((limit - 60)) --corpus "$work/corpus-long" --json "$work/fuzz_long.json" --no-progress \
        > "$work/fuzz_long.txt" 2>&1) &
    (for k in flash efficient; do
       timeout "$limit" python3 -m flashcheck.cli fuzz "torch:$k" --device cuda --preset adversarial --seed 1 --keep-going \
           --time-budget $(((limit - 60) / 2)) --corpus "$work/corpus-$k" --json "$work/fuzz_$k.json" --no-progress \
           > "$work/fuzz_$k.txt" 2>&1
     done) &
    mapfile -t bugs < <(names bugs)
    for s in 0 1 2 3 4 5 6 7 8; do
      args=(); for ((j = s; j < ${#bugs[@]}; j += 9)); do args+=(--variant "${bugs[j]}"); done
      shard "bugs$s" --variants bugs --bug-cases "${FLASHCHECK_BUG_CASES:-60}" "${args[@]}"
    done
    for v in "$@"; do  # extra rows, as VARIANT:DTYPE
      shard "extra_${v//[^a-z0-9]/_}" --variant "${v%:*}" --dtype "${v##*:}" --cases 520
    done
    wait
    pack
    tail -3 "$work/gpu_tests.txt" 2>/dev/null; tail -6 "$work/fuzz_long.txt"; tail -9 "$out/selftest_gpu.txt"
    for f in "$work"/crashes/*.txt; do [ -f "$f" ] && { echo "== $f"; tail -25 "$f"; }; done ;;
  *) echo "unknown part: $part" >&2; exit 2 ;;
esac
