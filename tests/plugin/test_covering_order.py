"""A property test of 25 examples judges every value regime: its first cases follow the covering order."""

from __future__ import annotations

import json

from flashcheck.inputs.recipe_draws import VALUE_ORDER

from ._repo import TINY_PRESET, run_pytest

TESTS = '''
import flashcheck
from flashcheck.numerics.twin import twin_attention


@flashcheck.kernel(causal=("none",), dtypes=("fp16",), head_dims=(16, 32), precision="flash")
def good(q, k, v, *, scale, causal, attn_mask=None):
    return twin_attention(q, k, v, scale=scale, causal=causal)


test_good = flashcheck.property_test(good, preset="tiny.toml", max_examples=25, seed=SEED)
'''


def _regimes(tmp_path, seed: int) -> list[str]:
    (tmp_path / "tiny.toml").write_text(TINY_PRESET)
    (tmp_path / "test_cover.py").write_text(TESTS.replace("SEED", str(seed)))
    (tmp_path / "pytest.ini").write_text("[pytest]\nflashcheck_device = cpu\nflashcheck_json = verdicts.json\n")
    result = run_pytest(tmp_path)
    assert result.ret == 0, "\n".join(result.outlines[-20:])
    records = json.loads((tmp_path / "verdicts.json").read_text())["verdicts"]
    return [r["regime"].split("/")[0] for r in records if r.get("phase") == "generate"]


def test_a_property_test_of_25_examples_judges_every_value_regime(tmp_path):
    regimes = _regimes(tmp_path, seed=0)
    assert len(regimes) == 25
    assert set(regimes) == set(VALUE_ORDER), sorted(set(VALUE_ORDER) - set(regimes))
    assert set(regimes[:len(VALUE_ORDER) + 5]) == set(VALUE_ORDER)  # within the singles, before free drawing
