#!/usr/bin/env bash
# The torch:flash GQA dK finding on a CUDA machine, in one call (about 5 minutes):
#   1. the backward campaign that found it (seed 13, --jobs 8, 60 s) on OLD_SRC (a checkout's src/ from before
#      the spec excluded the class, so that the campaign meets it), its corpus kept;
#   2. benchmarks/gqa_share_probe.py on the hand-built case, its control and the campaign's GQA findings;
#   3. tests/gpu/test_sdpa_backward_defects_gpu.py.
# Usage (repository root): OLD_SRC=path/to/old/src bash benchmarks/gpu_gqa_share.sh OUTDIR
set -uo pipefail
source "$(dirname "$0")/gpu_fuzz.sh"
campaign_setup gqa-share 60 "$@"
PYTHONPATH=$OLD_SRC timeout 150 python3 -m flashcheck.cli fuzz torch:flash --device cuda --backward --jobs 8 \
    --seed 13 --keep-going --max-examples 100000 --time-budget "$seconds" --corpus "$work/corpus" --json "$out/campaign.json" \
    --no-progress > "$out/campaign.txt" 2>&1
echo "campaign exit $?" >> "$out/campaign.txt"
tail -12 "$out/campaign.txt"
find "$work/corpus" -name '*.json' | head -40 > "$work/found.txt"
tar -czf "$out/corpus.tar.gz" -C "$work" corpus 2>/dev/null
timeout 200 python3 benchmarks/gqa_share_probe.py cuda $(cat "$work/found.txt") > "$out/probe.txt" 2>&1
echo "probe exit $?" >> "$out/probe.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_sdpa_backward_defects_gpu.py -s \
    > "$out/gpu_tests.txt" 2>&1
tail -3 "$out/gpu_tests.txt"
cat "$out/probe.txt"
