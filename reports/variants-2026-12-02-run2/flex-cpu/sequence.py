"""Replays saved cases in order in one process on torch:flex compiled with automatic dynamic shapes (the adapter
before dynamic=False); prints each verdict."""
import sys
import torch
import flashcheck
import flashcheck.kernels.flex as flex
from flashcheck.inputs.casefile import load_case

fa = flex._flex_module()
if sys.argv[1] == "dynamic":
    flex._COMPILED["fn"] = torch.compile(fa.flex_attention)
for path in sys.argv[2:]:
    v = flashcheck.check("torch:flex", load_case(path), device="cpu", properties=())
    print(path.split("/")[-1][:40], v.status, [f.diagnosis[:120] for f in v.findings], flush=True)
