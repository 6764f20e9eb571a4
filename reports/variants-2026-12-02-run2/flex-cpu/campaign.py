"""The torch:flex CPU campaign of 2026-12-02 (seed 2) on the adapter as it was then: flex_attention compiled with
torch.compile's automatic dynamic shapes (the adapter now passes dynamic=False). Runs in this process."""
import sys
import torch
import flashcheck.kernels.flex as flex
from flashcheck.cli import main

fa = flex._flex_module()
flex._COMPILED["fn"] = torch.compile(fa.flex_attention)  # dynamic=None: the earlier adapter's
sys.exit(main(["fuzz", "torch:flex", "--device", "cpu", "--preset", "adversarial", "--seed", "2", "--max-examples",
               "40", "--no-isolation", "--corpus", sys.argv[1], "--json", sys.argv[1] + "/fuzz.json", "--no-progress"]))
