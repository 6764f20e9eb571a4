#!/usr/bin/env bash
# Where one case's time goes, on a CUDA machine in one call: a cProfile of a one-process campaign of torch:flash
# on the adversarial preset (--no-isolation, so that the profile sees the judging), its top functions by own
# time and the callers of the few that lead; then bench_campaign.py's ROWS (default flash-1-worker,longctx-4).
# Usage (repository root): bash benchmarks/gpu_profile.sh OUTDIR [SECONDS] [ROWS]
set -uo pipefail
out=$1; seconds=${2:-30}; rows=${3:-flash-1-worker,longctx-4}
mkdir -p "$out"
python3 - "$out" "$seconds" <<'PY'
import cProfile, pstats, sys, io
out, seconds = sys.argv[1], sys.argv[2]
sys.argv = ["flashcheck", "fuzz", "torch:flash", "--device", "cuda", "--preset", "adversarial", "--seed", "1",
            "--keep-going", "--no-isolation", "--no-progress", "--max-examples", "100000", "--time-budget", seconds,
            "--corpus", out + "/corpus-prof", "--json", out + "/prof.json"]
from flashcheck.cli.main import main
profile = cProfile.Profile()
try:
    profile.runcall(main)
except SystemExit:
    pass
profile.dump_stats(out + "/prof.bin")
text = io.StringIO()
stats = pstats.Stats(profile, stream=text)
stats.sort_stats("tottime").print_stats(45)
stats.sort_stats("cumtime").print_stats("flashcheck", 60)
stats.print_callers(r"builtins.compile|\{method 'any'|torch.where|method 'to'", 8)
open(out + "/prof.txt", "w").write(text.getvalue())
PY
python3 benchmarks/bench_campaign.py --device cuda --rows "$rows" --seconds "$seconds" \
    --json "$out/rows.json" 2> "$out/rows.log"
