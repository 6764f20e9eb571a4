#!/usr/bin/env bash
# SGLang's Triton MLA decode (sglang:mla-decode) on the GPU in one call: its wheels from .whl/ (gpu_setup.sh installs
# them), then campaigns side by side for SECONDS each, the adversarial preset and the mla preset in fp16 and bf16
# (--keep-going: every distinct bug), and each saved finding replayed as a control on flashcheck's reference of the
# same form, torch:mla-paged, and on flashcheck:triton-mla: a finding that the references pass is the kernel's.
# Usage (repository root): bash benchmarks/gpu_sglang_mla.sh OUTDIR [SECONDS]
set -uo pipefail
source "$(dirname "$0")/gpu_fuzz.sh"
campaign_setup sglang-mla 200 "${1:-}" A "${2:-}"
python3 -c "import importlib.metadata as m; print('sglang', m.version('sglang'))" >> "$work/machine.txt" 2>&1
fuzz sglang-adversarial sglang:mla-decode 3 "$seconds" --keep-going &
for dtype in fp16 bf16; do
  FUZZ_PRESET=mla fuzz "sglang-mla-$dtype" sglang:mla-decode 2 "$seconds" --keep-going --dtype "$dtype" &
done
wait
for case in "$work"/corpus-*/*.json; do
  [ -e "$case" ] || continue
  for control in torch:mla-paged flashcheck:triton-mla; do
    echo "== $(basename "$case") on $control" >> "$work/controls.txt"
    python3 -m flashcheck.cli replay "$case" --kernel "$control" --device cuda 2>&1 | head -3 >> "$work/controls.txt"
  done
done
campaign_archive sglang-mla
campaign_table | tee "$out/table.txt"
[ -e "$work/controls.txt" ] && grep -c "^PASS" "$work/controls.txt" | sed 's/^/controls passing: /'
