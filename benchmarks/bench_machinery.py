"""Benchmark: the case rate of a campaign whose judge costs nothing, the ceiling of one process.

Runs a real campaign in this process (hypothesis's engine, the covering order, the rounds, the counts, the
example database and the corpus) on a preset's recipes, with the step that draws and judges a case replaced by
one that returns a passing verdict at once (its err/budget a number of the recipe, so that hypothesis's target
phase sees scores that vary). What is left is what every case costs before any tensor exists: the ceiling of
one campaign process, whatever the kernel and however fast flashcheck judges.

    python benchmarks/bench_machinery.py --seconds 20 --preset adversarial --spec torch:math
"""

from __future__ import annotations

import argparse
import tempfile
import time

from flashcheck.campaign import run as campaign_run
from flashcheck.campaign.config import CampaignConfig, Target
from flashcheck.inputs.presets import load_preset
from flashcheck.judge.verdict import Verdict


def free_judge(self, recipe, properties, *, anchors=False):
    """A passing verdict at once; its err/budget in [0, 1) from the recipe (hypothesis seeds Python's random
    for every case, so a random draw here would give every case the same score)."""
    verdict = Verdict.from_findings([], max_ratio=(hash(recipe) % 1000) / 1000, kernel="free", case="-",
                                    regime=recipe.regime)
    verdict.elapsed = {"generation": 0.0}
    return verdict, None


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--preset", default="adversarial")
    parser.add_argument("--spec", default="torch:math", help="the kernel whose spec the recipes are drawn for")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    campaign_run._Campaign.judge_recipe = free_judge
    with tempfile.TemporaryDirectory() as corpus:
        config = CampaignConfig(Target(args.spec, "cpu", load_preset(args.preset))).replace(
            max_examples=10**7, time_budget=args.seconds, seed=args.seed, corpus=corpus, isolate=False,
            keep_going=True)
        start = time.perf_counter()
        result = campaign_run.run_campaign(config)
        wall = time.perf_counter() - start
    row = {"preset": args.preset, "spec": args.spec, "cases": result.cases, "seconds": round(wall, 2),
           "cases_per_s": round(result.cases / result.elapsed, 1),
           "ms_per_case": round(1000 * result.elapsed / max(result.cases, 1), 3)}
    print(f"a judge that costs nothing, {args.preset} for {args.spec}: {row['cases']} cases in "
          f"{result.elapsed:.1f} s, {row['cases_per_s']} cases/s, {row['ms_per_case']} ms a case")
    return row


if __name__ == "__main__":
    main()
