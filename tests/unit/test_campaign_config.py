"""A campaign is asked for by one frozen record, ``CampaignConfig``: checked where it is made, changed only by
making another, and pickled whole to each ``--jobs`` worker."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from flashcheck import InvalidArgument
from flashcheck.campaign.config import CampaignConfig, Drawing, Execution, Limits, Storage, Target
from flashcheck.campaign.parallel import run_campaigns
from flashcheck.inputs.presets import load_preset

SMOKE = load_preset("smoke")


def _kernel(q, k, v, *, scale, causal, attn_mask=None):
    return q


def test_the_parts_say_what_how_long_which_where_and_how():
    config = CampaignConfig(Target("torch:math", "cpu", SMOKE, ("fp16",)), Limits(max_examples=7, keep_going=True),
                            Drawing(seed=3), Storage("c", records=True), Execution(case_timeout=9.0))
    assert (config.max_examples, config.time_budget, config.isolated) == (7, SMOKE.time_budget, True)
    assert CampaignConfig(Target("torch:math", "cpu", SMOKE)).max_examples == SMOKE.max_examples
    assert pickle.loads(pickle.dumps(config)) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.started_at = 1.0


def test_replace_changes_the_fields_of_any_part():
    config = CampaignConfig(Target("torch:math", "cpu", SMOKE)).replace(seed=3, corpus="c", max_examples=5,
                                                                        isolate=False, started_at=2.0)
    assert (config.drawing.seed, config.storage.corpus, config.limits.max_examples) == (3, "c", 5)
    assert (config.execution.isolate, config.started_at, config.target.kernel) == (False, 2.0, "torch:math")
    with pytest.raises(TypeError):
        config.replace(no_such_field=1)


def test_what_the_record_can_check_alone_it_checks_when_made():
    with pytest.raises(InvalidArgument, match="kernel_options.*given by name"):
        CampaignConfig(Target(_kernel, "cpu", SMOKE, kernel_options={"block_m": 16}))
    with pytest.raises(InvalidArgument, match="case_timeout.*runs in-process"):
        CampaignConfig(Target("torch:math", "cpu", SMOKE), execution=Execution(isolate=False, case_timeout=5.0))
    object_kernel = CampaignConfig(Target(_kernel, "cpu", SMOKE))
    assert not object_kernel.isolated  # an object cannot be resolved again in another process
    with pytest.raises(InvalidArgument, match="kernel.*by its name"):
        run_campaigns(object_kernel, jobs=2)
