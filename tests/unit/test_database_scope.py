"""The example database is keyed per campaign: one kernel never replays another's stored failures, nor a
campaign the choices stored under another strategy (spec, pass, preset)."""

from __future__ import annotations

from flashcheck.campaign.database import campaign_scope
from flashcheck.inputs.presets import load_preset
from tests.cli import _planted

DRAWING = load_preset("smoke").strategy_options()


def scope(kernel=_planted.correct, **changes):
    options = dict(spec=kernel.spec, kernel_options=None, backward=False, drawing=DRAWING) | changes
    return campaign_scope(kernel, **options)


def test_the_same_campaign_has_the_same_scope_and_any_change_of_drawing_another():
    assert scope() == scope() and len(scope()) == 16
    others = [scope(_planted.scale_bug), scope(kernel_options={"block_m": 32}), scope(backward=True),
              scope(spec=_planted.correct.spec.replace(gqa=False)), scope(drawing={**DRAWING, "max_n": 64})]
    assert len({scope(), *others}) == 1 + len(others)
