# Sourced by the GPU campaign scripts: campaign_setup (their arguments, $work and the machine), fuzz, one
# campaign into $work, and campaign_table, the short table printed last. FUZZ_PRESET (default adversarial) is the
# preset of every campaign.
campaign_setup() {  # NAME DEFAULT-SECONDS [OUTDIR [PART [SECONDS]]]: sets out, part, seconds and work
  out=${3:-${OUT:-/tmp/flashcheck-$1}}
  part=${4:-A}
  seconds=${5:-$2}
  work=$(mktemp -d)
  mkdir -p "$out"
  source "$(dirname "${BASH_SOURCE[0]}")/gpu_setup.sh"
}
fuzz() {  # NAME KERNEL JOBS SECONDS [FUZZ-ARGUMENTS...]: one campaign, its text, JSON and corpus
  local name=$1 kernel=$2 jobs=$3 budget=$4; shift 4
  python3 -m flashcheck.cli fuzz "$kernel" --device cuda --preset "${FUZZ_PRESET:-adversarial}" --seed 1 \
      --keep-going --max-examples 100000 --time-budget "$budget" --jobs "$jobs" --corpus "$work/corpus-$name" \
      --json "$work/$name.json" --no-progress "$@" > "$work/$name.txt" 2>&1
  echo "fuzz $name exit $?" >> "$work/$name.txt"
}
campaign_archive() {  # NAME: $work as $out/NAME.tgz, and its text, summaries and saved cases' JSON (no tensors) as
  # $out/NAME-text.tgz, small enough to come back from a machine that returns files of at most 16 MiB
  tar -czf "$out/$1.tgz" -C "$work" . 2>/dev/null
  (cd "$work" && tar -czf "$out/$1-text.tgz" $(ls *.txt *.json corpus-*/*.json 2>/dev/null))
}
campaign_table() {  # the machine, the GPU tests' last line and one row per campaign JSON in $work
  python3 - "$work" <<'PY'
import json, pathlib, sys
work = pathlib.Path(sys.argv[1])
print((work / "machine.txt").read_text().strip())
tests = work / "gpu_tests.txt"
if tests.exists():
    print("gpu tests:", tests.read_text().strip().splitlines()[-1])
print(f"{'campaign':<26} {'verdict':<9} {'cases':>7} {'cases/s':>8} {'bugs':>5} {'susp':>5} {'compiled':>8}"
      "  max err/budget by dtype")
for path in sorted(work.glob("*.json")):
    s = json.loads(path.read_text())
    if "verdict" not in s:
        continue
    ratios = ", ".join(f"{d} {v:.3g}" if isinstance(v, float) else f"{d} {v}"
                       for d, v in sorted((s.get("max_ratio_by_dtype") or {}).items()))
    status = (s.get("counts") or {}).get("by_status") or {}
    print(f"{path.stem:<26} {s.get('verdict', '?'):<9} {s.get('cases', 0):>7} {s.get('cases_per_s') or 0:>8.1f} "
          f"{status.get('BUG', 0):>5} {status.get('SUSPICIOUS', 0):>5} {s.get('compilations') or 0:>8}  {ratios}")
PY
}
