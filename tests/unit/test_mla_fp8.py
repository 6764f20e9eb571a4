"""FlashMLA's fp8 latent cache with the MLA form: the ``flashmla_fp8`` scheme (K's 512 latent dims as e4m3 codes with an
fp32 scale per 128, the 64 rope dims and q in bf16) and its refusals, its cases in every block regime with V sharing
K's codes and scales, the oracle on the exact codes times scales, the budget's in-kernel bf16 roundings, the packed
656-byte rows of ``torch:mla-fp8``, its planted misreads caught, and the quantization error reported apart."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from flashcheck import InvalidArgument, KernelSpec
from flashcheck.campaign.config import CampaignConfig, Target
from flashcheck.campaign.run import run_campaign
from flashcheck.contract.mla import MODEL_SCALE
from flashcheck.contract.quantization import SCHEMES, Blocks, Scheme, scheme_named
from flashcheck.contract.validation import Shapes
from flashcheck.features.variant import Variant
from flashcheck.inputs.case import AttentionCase, load_case
from flashcheck.inputs.presets import load_preset
from flashcheck.inputs.quantization import BLOCK_REGIMES, block_regime, rescaled_case
from flashcheck.inputs.quantization_error import quantization_error
from flashcheck.inputs.recipe import Recipe
from flashcheck.judge.check import check
from flashcheck.kernels.mla_fp8 import flash_mla_fp8, pack_rows, row_bytes
from flashcheck.kernels.planted import MLA_FP8
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.numerics.budget import contract_terms
from flashcheck.numerics.oracle import reference_attention

from tests._planted import first_catching_case

NAME, SCHEME = "torch:mla-fp8", SCHEMES["flashmla_fp8"]
SHAPES = Shapes(2, 6, 1, 3, 70, 576, 512)


def _case(regime: str = "amax", *, shapes: Shapes = SHAPES, values: str = "random", form_values: str = "none"):
    seed = next(s for s in range(100) if block_regime(s) == regime)
    return Recipe(shapes, "bf16", values=values, causal="bottom_right", seed=seed, shared_kv=True,
                  base_scale=MODEL_SCALE, form_values=form_values,
                  settings={"quantization": "flashmla_fp8"}).build()


# ---- the scheme -----------------------------------------------------------------------------------------------


def test_the_scheme_names_the_latent_codes_the_rope_and_q_left_in_bf16():
    spec = KernelSpec(mla=True, dtypes=("bf16",), quantization="flashmla_fp8")
    assert spec.quantization is SCHEME and SCHEME.q is None and not SCHEME.descales
    assert (SCHEME.k.size, SCHEME.k.axis, SCHEME.k.format, SCHEME.k.span, SCHEME.held_codes) == (128, "dims", "fp32",
                                                                                                 512, "fp8_e4m3")
    assert SCHEME.holds_codes("bf16") and not SCHEME.holds_codes("fp8_e4m3") and not SCHEME.holds_codes("fp16")
    assert scheme_named(SCHEME.as_dict()) is SCHEME and scheme_named(dict(vars(SCHEME), name="mine")).k == SCHEME.k
    assert "first 512" in SCHEME.text() and "fp8_e4m3 codes in bf16 inputs" in SCHEME.text()


@pytest.mark.parametrize("make, argument, words", [
    (lambda: KernelSpec(mla=True, quantization="flashmla_fp8"), "dtypes", "bf16 inputs that hold fp8_e4m3 codes"),
    (lambda: KernelSpec(dtypes=("bf16",), quantization="flashmla_fp8"), "quantization", "has None latent dims"),
    (lambda: KernelSpec(mla={"kv_lora_rank": 256, "rope_dim": 64}, dtypes=("bf16",), quantization="flashmla_fp8"),
     "quantization", "has 256 latent dims"),
    (lambda: Blocks(128, "tokens", span=512), "span", "axis='tokens'"),
    (lambda: Blocks(128, "dims", span=0), "span", "positive count"),
    (lambda: Scheme("mine", k=Blocks(128, "dims", span=512)), "span", "compute format"),
    (lambda: Scheme("mine", k=Blocks(128, "dims"), held_codes="fp8_e4m3", descales=False), "held_codes", "compute=None"),
    (lambda: Scheme("mine", k=Blocks(128, "dims"), held_codes="int4", compute="bf16", descales=False), "held_codes",
     "unknown"),
])
def test_a_scheme_that_cannot_hold_its_codes_is_refused_by_name(make, argument, words):
    with pytest.raises(InvalidArgument) as raised:
        make()
    assert raised.value.argument == argument and words in str(raised.value) and raised.value.fix


# ---- the cases and the oracle -----------------------------------------------------------------------------------


def test_a_drawn_case_holds_latent_codes_bf16_rope_and_q_and_v_shares_ks_codes_and_scales():
    spec = resolve_kernel(NAME, device="cpu").spec
    case = Recipe.from_dict(_case().provenance["recipe"]).build()
    source = Recipe.from_dict(case.provenance["recipe"]).source_values()
    assert case.q.dtype == case.k.dtype == torch.bfloat16 and spec.dtypes == ("bf16",)
    latent = case.k[..., :512]
    assert torch.equal(latent.to(torch.float8_e4m3fn).to(torch.bfloat16), latent)  # e4m3 codes, held in bf16
    assert torch.equal(case.k[..., 512:].float(), source[1][..., 512:]) and torch.equal(case.q.float(), source[0])
    assert torch.equal(case.v, latent) and torch.equal(source[2], source[1][..., :512])
    scales = case.variant.k_block_scales
    assert scales.shape == (2, 1, 70, 4) and torch.equal(case.variant.v_block_scales, scales)
    assert case.variant.kwargs().keys() == {"k_block_scales", "v_block_scales"}  # no descales: FlashMLA has none
    assert "flashmla_fp8=amax" in case.provenance["strategy"]


def test_the_block_regimes_shape_the_latents_blocks_of_128():
    zero, tiny, same, outlier, top = (_case(r) for r in ("zero_blocks", "tiny_scales", "identical", "outlier",
                                                         "saturating"))
    blocks = zero.k[..., :512].unflatten(-1, (4, 128))
    empty = zero.variant.k_block_scales == 0
    assert bool(empty.any()) and bool((blocks[empty] == 0).all()) and bool((zero.k[..., 512:] != 0).any())
    assert float(tiny.variant.k_block_scales[tiny.variant.k_block_scales > 0].min()) < 2.0**-100
    repeated = same.k[..., :512].unflatten(-1, (4, 128))
    assert bool((repeated == repeated[..., :1]).all(-1).any())
    codes = outlier.k[..., :512].float().abs()
    assert bool(((codes > 0) & (codes < 2.0**-6)).any())  # values beside an outlier fall to e4m3's subnormals
    assert float(top.k[..., :512].float().abs().max()) == 448.0
    assert set(BLOCK_REGIMES) == {"amax", "zero_blocks", "tiny_scales", "identical", "outlier", "saturating"}


def test_the_oracle_attends_each_e4m3_code_times_its_fp32_scale_exactly():
    """Every finite e4m3 code (as torch casts its byte) times fp32 scales that are no power of two, from 2^-120 to
    2^10: the dequantized values are the exact products, and the packed row holds the codes' own bytes."""
    byte = torch.tensor([b for b in range(256) if b not in (0x7F, 0xFF)], dtype=torch.uint8)
    codes = torch.cat((byte, byte[:2])).view(torch.float8_e4m3fn).view(1, 1, 1, 256).repeat(1, 1, 2, 2)
    k = torch.cat((codes.to(torch.bfloat16), torch.randn(1, 1, 2, 64).to(torch.bfloat16)), -1)
    scales = torch.tensor([[3 * 2.0**-122, 0.1, 5.0 / 3, 1000.3], [7e-3, 2.0**-60 / 3, 1.1, 0.0]]).view(1, 1, 2, 4)
    variant = Variant(descales=torch.ones(3, 1, 1), quantization=SCHEME, k_block_scales=scales,
                      v_block_scales=scales)
    case = AttentionCase.create(torch.randn(1, 2, 1, 576).to(torch.bfloat16), k, k[..., :512], scale=0.1,
                                variant=variant)
    _, kd, vd = case.variant.dequantized(case.q, case.k, case.v)
    want = [[Fraction(float(c)) * Fraction(float(s)) for c, s in zip(codes.double()[0, 0, t].tolist(),
                                                                        scales[0, 0, t].repeat_interleave(128))]
            for t in range(2)]
    assert [[Fraction(x) for x in kd[0, 0, t, :512].tolist()] for t in range(2)] == want
    assert torch.equal(kd[..., 512:], k[..., 512:].double()) and torch.equal(vd, kd[..., :512])
    raw = pack_rows(case.k, scales).view(torch.uint8)
    assert raw.shape[-1] == row_bytes(512, 64) == 656 and torch.equal(raw[..., :512], codes.view(torch.uint8))
    assert torch.equal(raw[..., 512:528].contiguous().view(torch.float32), scales)
    with pytest.raises(InvalidArgument, match="not fp8_e4m3 codes"):
        case.variant.dequantized(case.q, case.k * 1.01, case.v)


def test_the_budget_takes_the_bf16_roundings_of_each_value_and_its_scale():
    terms = contract_terms("flash", "bf16", SCHEME)
    twice = (1 + 2.0**-8) ** 2 - 1  # the scale rounded to bf16, then the product: FlashMLA's SM90 decode
    assert (terms.u_in, terms.u_v, terms.u_p, terms.u_o, terms.scale_ulps) == (twice, twice, 2.0**-8, 2.0**-8, 3.0)
    assert contract_terms("flash", "fp16", SCHEME) == contract_terms("flash", "fp16")


# ---- the reference and its planted bugs -------------------------------------------------------------------------


@pytest.mark.parametrize("regime", BLOCK_REGIMES)
def test_the_reference_passes_in_every_block_regime(regime):
    case = _case(regime, form_values="rope_dominant" if regime == "amax" else "none")
    verdict = check(NAME, case, device="cpu")
    assert verdict.status == "PASS" and 0 < verdict.max_ratio < 1, str(verdict)


def test_flashmlas_paged_call_reads_the_packed_rows_through_its_block_table():
    case = _case(shapes=Shapes(1, 4, 1, 2, 40, 576, 512))
    dense = resolve_kernel(NAME, device="cpu")(case.q, case.k, case.v, scale=case.scale, causal=case.causal,
                                               **case.variant.kwargs())
    rows = pack_rows(case.k, case.variant.k_block_scales)[0, 0]  # (40, 656)
    cache = torch.zeros(4, 16, 1, 656, dtype=torch.float8_e4m3fn)
    cache.view(-1, 656)[torch.arange(40) % 16 + 16 * torch.tensor([3, 0, 2]).repeat_interleave(16)[:40]] = rows
    out, lse = flash_mla_fp8(case.q.transpose(1, 2), cache, torch.tensor([[3, 0, 2]], dtype=torch.int32),
                             torch.tensor([40], dtype=torch.int32), 512, softmax_scale=case.scale, causal=True)
    assert torch.equal(out.transpose(1, 2), dense[0]) and torch.equal(lse, dense[1])


@pytest.mark.parametrize("bug", [b.name for b in MLA_FP8])
def test_each_misread_of_the_packed_row_is_caught_within_40_cases(bug):
    kernel = resolve_kernel(f"{NAME}~{bug}", device="cpu")
    assert first_catching_case(kernel, max_n=64) is not None, f"{kernel.name} passed 40 cases"


def test_scales_through_e8m0_are_caught_by_the_values_alone():
    """FlashMLA PR 184: each scale rounded toward zero to a power of two. Its error is the values' (up to half of
    each), not a crash, so the forward check alone, without properties, must see it."""
    verdict = check(f"{NAME}~scales_through_e8m0", _case(), device="cpu", properties=(), envelope=False)
    assert verdict.status == "BUG" and verdict.max_ratio > 1 and "over_budget" in {f.kind for f in verdict.findings}


def test_the_descale_property_moves_a_power_of_two_into_the_latents_scales_only():
    drawn = _case()
    assert rescaled_case(drawn) is None  # codes at 448 and in e4m3's subnormals: neither doubled nor halved exactly
    latent = drawn.k[..., :512]
    k = torch.cat((torch.where(latent.abs() <= 224, latent, 0), drawn.k[..., 512:]), -1)  # codes that double exactly
    case = AttentionCase.create(drawn.q, k, k[..., :512], scale=drawn.scale, causal=drawn.causal,
                                variant=drawn.variant)
    what, rescaled = rescaled_case(case)
    assert what == "k times 2 and k_block_scales over 2, v times 2 and v_block_scales over 2"  # q has no scale
    assert torch.equal(rescaled.q, case.q) and torch.equal(rescaled.k[..., 512:], case.k[..., 512:])
    assert torch.equal(rescaled.v, rescaled.k[..., :512])
    want, got = (reference_attention(c.q, c.k, c.v, scale=c.scale, causal=c.causal, variant=c.variant).out
                 for c in (case, rescaled))
    assert torch.equal(want, got)


# ---- the quantization error, apart from the verdict ----------------------------------------------------------------


def test_a_saved_case_replays_and_a_campaign_samples_its_quantization_error(tmp_path):
    case = _case()
    error = quantization_error(case)
    assert error is not None and 0.9 < error.cosine < 1 and error.max_abs > 0
    case.save(tmp_path / "case")
    loaded = load_case(tmp_path / "case.json")
    assert loaded.equal_bits(case) and check(f"{NAME}~scale_of_next_block", loaded, device="cpu").status == "BUG"
    result = run_campaign(CampaignConfig(Target(NAME, "cpu", load_preset("adversarial"))).replace(
        seed=1, max_examples=2, corpus=tmp_path, database=tmp_path / "db", isolate=False))
    summary = result.summary()
    assert summary.verdict == "PASS" and summary.quantization_error["bf16"]["cases"] == 1  # one in four: the first
