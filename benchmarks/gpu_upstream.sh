#!/usr/bin/env bash
# The upstream reproducers of the defects found on the H200, in one call: benchmarks/upstream_repros.py --device cuda
# writes OUTDIR/<slug>/repro.py and ISSUE.md for each catalogue entry (flashcheck repro, or the hand-written
# script), runs each repro.py where flashcheck cannot be imported, and writes table-cuda.md and .json in OUTDIR.
# Everything stays under OUTDIR (one folder per entry); the driver's log is OUTDIR/driver.txt, the machine
# OUTDIR/machine.txt, the scripts and issues also packed into OUTDIR/upstream-cuda.tgz. The table is printed last.
# Usage (repository root): [ENTRY_SECONDS=S] bash benchmarks/gpu_upstream.sh OUTDIR [SECONDS (default 220)]
set -uo pipefail
out=${1:?"usage: bash benchmarks/gpu_upstream.sh OUTDIR [SECONDS]: OUTDIR is missing"}
seconds=${2:-220}
mkdir -p "$out"
work=$out
source benchmarks/gpu_setup.sh
# Whether flashcheck is installed on this machine (the driver blocks it for the scripts either way).
(cd "$out" && env -u PYTHONPATH python3 -c "import flashcheck; print('flashcheck installed:', flashcheck.__file__)" \
  || echo "flashcheck not installed") >> "$out/machine.txt" 2>&1
# Each repro and each script at most $ENTRY_SECONDS (default 100) s, eight entries at once; the whole run within
# $seconds.
timeout -k 10 "$seconds" python3 benchmarks/upstream_repros.py --device cuda --out "$out" --jobs 8 --timeout "${ENTRY_SECONDS:-100}" \
  > "$out/driver.txt" 2>&1
echo "driver exit status $? (124: stopped at $seconds s; the table keeps the finished rows)" >> "$out/driver.txt"
tar czf "$out/upstream-cuda.tgz" -C "$out" --exclude=upstream-cuda.tgz --exclude='*.txt' . 2>/dev/null
tail -n 3 "$out/driver.txt"
cat "$out/machine.txt"
cat "$out"/table-cuda.md 2>/dev/null || echo "no table: see $out/driver.txt"
