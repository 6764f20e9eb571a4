"""The MLA form's value regimes that set the two parts of each logit against each other (flashcheck.features.mla):
each does what it says on a drawn case, keeps V the latent of K bit for bit, leaves torch:mla within the budget in
fp16 and bf16, and a kernel that drops the rope part is caught on rope_dominant."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck.contract.mla import MODEL_SCALE
from flashcheck.contract.validation import Shapes
from flashcheck.features.forms import value_pools
from flashcheck.inputs.recipe import Recipe
from flashcheck.kernels.registry import resolve_kernel

REGIMES = ("rope_dominant", "latent_dominant", "cancelling_parts", "huge_rope_logits")
SHAPES = Shapes(1, 16, 1, 2, 200, 576, 512)


def _case(regime: str, dtype: str, seed: int = 2):
    return Recipe(SHAPES, dtype, seed=seed, shared_kv=True, base_scale=MODEL_SCALE, form_values=regime).build()


def _parts(case) -> tuple:
    """Each logit's latent part and rope part (before the scale), in float64."""
    q, k = case.q.double(), case.k.double()
    return q[..., :512] @ k[..., :512].transpose(-1, -2), q[..., 512:] @ k[..., 512:].transpose(-1, -2)


def _share(condition: torch.Tensor) -> float:
    return condition.double().mean().item()


def test_the_regimes_are_drawn_for_an_mla_kernel_only():
    pool = value_pools(resolve_kernel("torch:mla", device="cpu").spec)["form_values"]
    assert pool == ["none", "heavy_rope", *REGIMES]
    assert value_pools(resolve_kernel("torch:math", device="cpu").spec) == {}


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_each_regime_sets_the_parts_as_it_says(dtype):
    plain_lat, plain_rope = _parts(_case("none", dtype))
    assert _share(plain_rope.abs() > 8 * plain_lat.abs()) < 0.1  # what the regimes change

    lat, rope = _parts(_case("rope_dominant", dtype))
    assert _share(rope.abs() > 8 * lat.abs()) > 0.9

    lat, rope = _parts(_case("latent_dominant", dtype))
    assert _share(lat.abs() > 8 * rope.abs()) > 0.95

    lat, rope = _parts(_case("cancelling_parts", dtype))
    small = (lat + rope).abs()
    assert _share((16 * small < rope.abs()) & (16 * small < lat.abs())) > 0.9
    assert rope.abs().median() > 8 * plain_rope.abs().median()  # the parts are large, not the logits small

    lat, rope = _parts(_case("huge_rope_logits", dtype))
    assert (rope * MODEL_SCALE).abs().max() > 1e4 and _share(rope.abs() > 8 * lat.abs()) > 0.95
    assert lat.abs().max() == plain_lat.abs().max()  # the latent part is the plain case's


@pytest.mark.parametrize("regime", REGIMES)
def test_v_stays_the_latent_of_k_and_every_value_is_finite(regime):
    for dtype in ("fp16", "bf16"):
        case = _case(regime, dtype)
        assert torch.equal(case.v.view(torch.int16), case.k[..., :512].contiguous().view(torch.int16))
        assert torch.isfinite(case.q).all() and torch.isfinite(case.k).all()


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_torch_mla_passes_each_regime(regime, dtype):
    verdict = flashcheck.check("torch:mla", _case(regime, dtype), device="cpu", properties=())
    assert verdict.status == "PASS", verdict


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_dropping_the_rope_part_is_caught_on_rope_dominant(dtype):
    verdict = flashcheck.check("torch:mla~drops_rope", _case("rope_dominant", dtype), device="cpu", properties=(),
                               envelope=False)
    assert verdict.status == "BUG" and verdict.max_ratio > 8
