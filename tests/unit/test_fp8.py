"""fp8 inputs (e4m3, e5m2) with FA3's descales: the oracle works on the dequantized values, the budget rounds
P to fp8 and the output to bf16, the ``descale`` property rescales q, k and v against their descales, and
the reference ``torch:fp8`` passes while its planted bugs (a descale ignored or applied twice) are found."""

from __future__ import annotations

import json

import pytest
import torch

import flashcheck
from flashcheck.campaign.config import CampaignConfig, Target
from flashcheck.campaign.run import run_campaign
from flashcheck.cli.main import main
from flashcheck.contract.validation import Shapes
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.presets import load_preset
from flashcheck.inputs.quantization import DESCALE_REGIMES, descale_regime
from flashcheck.inputs.recipe import Recipe
from flashcheck.judge.properties import rescaled_case
from flashcheck.numerics.budget import contract_terms

FP8 = ("fp8_e4m3", "fp8_e5m2")


def _case(dtype="fp8_e4m3", *, seed=0, values="random", causal="bottom_right"):
    return Recipe(shapes=Shapes(2, 4, 2, 5, 37, 16, 16), dtype=dtype, values=values, causal=causal,
                  seed=seed).build()


@pytest.mark.parametrize("dtype", FP8)
def test_the_oracle_attends_the_dequantized_values(dtype):
    case = _case(dtype)
    assert case.q.dtype == flashcheck.contract.formats.FORMATS[dtype].dtype
    d = case.variant.descales.double()
    assert d.shape == (3, 2, 2)
    q, k, v = (t.double() * d[i].repeat_interleave(t.shape[1] // 2, 1)[..., None, None]
               for i, t in enumerate((case.q, case.k, case.v)))
    k, v = (t.repeat_interleave(2, 1) for t in (k, v))
    s = (q @ k.transpose(-1, -2)) * case.scale
    s = s.masked_fill(~case.visible(), -torch.inf)
    want = torch.softmax(s, -1) @ v  # in float64, by hand
    got = flashcheck.reference_attention(case.q, case.k, case.v, scale=case.scale, causal=case.causal,
                                         variant=case.variant)
    assert bool(((got.out - want).abs() <= got.bound + 1e-15).all()), (got.out - want).abs().max()
    raw = flashcheck.reference_attention(case.q.float(), case.k.float(), case.v.float(), scale=case.scale,
                                         causal=case.causal)
    assert not torch.allclose(raw.out, want)  # the descales matter


def test_the_budget_rounds_p_to_fp8_and_the_output_to_bf16():
    terms = contract_terms("flash", "fp8_e4m3")
    assert terms.u_p == 2.0**-4 and terms.p_min_normal == 2.0**-6 and terms.s_p == 2.0**-10
    assert terms.u_o == 2.0**-8  # bf16 out
    assert contract_terms("flash", "fp8_e5m2").u_p == 2.0**-3


def test_descale_regimes_follow_the_seed_and_unit_descales_are_one():
    assert [descale_regime(s) for s in range(3)] == list(DESCALE_REGIMES)
    unit = _case(seed=DESCALE_REGIMES.index("unit"))
    assert bool((unit.variant.descales == 1).all())
    amax = _case(seed=DESCALE_REGIMES.index("amax"))
    assert float(amax.k.float().abs().max()) == 448.0  # the quantizer uses the whole range


@pytest.mark.parametrize("mutant", [None, "ignores_k_descale", "v_descale_twice"])
def test_the_reference_passes_and_each_planted_bug_is_found(mutant):
    name = "torch:fp8" + (f"~{mutant}" if mutant else "")
    statuses = {flashcheck.check(name, _case(dtype, seed=seed), device="cpu").status
                for dtype in FP8 for seed in range(3)}
    assert statuses == ({"PASS"} if mutant is None else {"BUG"} | statuses), statuses
    assert mutant is None or "BUG" in statuses


def test_the_descale_property_finds_an_ignored_k_descale_where_every_descale_is_one():
    case = _case(seed=DESCALE_REGIMES.index("unit"))
    verdict = flashcheck.check("torch:fp8~ignores_k_descale", case, device="cpu")
    assert [f.kind for f in verdict.findings] == ["descale_dependence"], str(verdict)
    assert "k times 2 and k_descale over 2" in verdict.findings[0].diagnosis
    assert flashcheck.check("torch:fp8~ignores_k_descale", case, device="cpu", properties=()).ok


@pytest.mark.parametrize("regime", DESCALE_REGIMES)
def test_a_rescaled_case_keeps_its_exact_output(regime):
    case = _case(seed=DESCALE_REGIMES.index(regime))
    what, rescaled = rescaled_case(case)
    changed = [n for n in "qkv" if not torch.equal(getattr(rescaled, n).float(), getattr(case, n).float())]
    assert what.count("times") == len(changed) + ("q_descale times 2" in what) >= 1, what
    ref = flashcheck.reference_attention(case.q, case.k, case.v, scale=case.scale, variant=case.variant)
    again = flashcheck.reference_attention(rescaled.q, rescaled.k, rescaled.v, scale=case.scale,
                                           variant=rescaled.variant)
    assert torch.allclose(ref.out, again.out, rtol=1e-14, atol=0)  # float64 sums of the same products


def test_an_ignored_descale_is_named_in_the_diagnosis():
    case = Recipe(shapes=Shapes(1, 2, 1, 3, 9, 16, 16), dtype="fp8_e4m3", values="random", seed=0).build()
    verdict = flashcheck.check("torch:fp8~ignores_k_descale", case, device="cpu", properties=())
    out = [f for f in verdict.findings if f.kind == "over_budget"]
    assert out and "descale ignored (fp8)" in out[0].diagnosis, str(verdict)


def test_descales_of_the_wrong_shape_are_refused_by_name():
    case = _case()
    with pytest.raises(flashcheck.InvalidArgument, match="descales"):
        AttentionCase.create(case.q, case.k, case.v, scale=case.scale,
                             variant=case.variant.replace(descales=torch.ones(3, 2, 4)))
    with pytest.raises(flashcheck.InvalidArgument, match="descales"):
        case.variant.replace(descales=-torch.ones(3, 2, 2))


def test_a_saved_fp8_case_round_trips_and_replays(tmp_path, capsys):
    case = _case("fp8_e5m2", seed=1)
    npz, saved = case.save(tmp_path / "case")
    back = AttentionCase.load(saved)
    assert back.equal_bits(case) and back.variant.descales is not None
    assert json.loads(saved.read_text())["format_version"] == 4
    assert main(["replay", str(saved), "--kernel", "torch:fp8~v_descale_twice", "--device", "cpu"]) == 1
    assert "BUG" in capsys.readouterr().out
    assert main(["replay", str(saved), "--kernel", "torch:fp8", "--device", "cpu"]) == 0


def test_an_adversarial_campaign_on_the_reference_passes_and_draws_both_formats(tmp_path):
    result = run_campaign(CampaignConfig(Target("torch:fp8", "cpu", load_preset("adversarial"))).replace(
        seed=1, max_examples=30, corpus=tmp_path, database=tmp_path / "db", isolate=False))
    summary = result.as_dict()
    assert summary["verdict"] == "PASS", summary["findings"]
    assert set(result.max_ratio_by_dtype) == set(FP8)


def test_a_campaign_finds_an_ignored_k_descale(tmp_path):
    result = run_campaign(CampaignConfig(Target("torch:fp8~ignores_k_descale", "cpu", load_preset("adversarial"))).replace(
        seed=1, max_examples=60, corpus=tmp_path, database=tmp_path / "db", isolate=False))
    assert result.as_dict()["verdict"] == "BUG"
