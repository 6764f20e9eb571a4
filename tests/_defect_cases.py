"""The defects the defect models must name: every model's planted bugs (flashcheck's Triton kernel, on its
exposing input) and the real defects of third-party kernels already classified in reports/, each with the model
that explains it. Shared by the tests (tests/interpreter/test_defect_models.py, tests/unit/test_defect_models.py,
tests/gpu/test_defect_models_gpu.py) and benchmarks/defect_table.py, which prints the table of fits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from flashcheck import AttentionCase
from flashcheck.judge.backward import backward_case
from tests._cases import cancelling_group_case

REPORTS = Path(__file__).parents[1] / "reports"
SDPA_CASES = Path(__file__).parent / "gpu" / "sdpa_backward_cases"


@dataclass(frozen=True)
class KnownDefect:
    """A defect and the model that explains it: ``load(device)`` gives (case, dO or None); ``kernel`` runs it
    (``model``: the model's name, or ``model(param)`` where the parameter is known)."""

    label: str
    kernel: str
    load: Callable
    model: str
    devices: tuple = ("cuda",)
    needs: str | None = None  # a module the kernel needs (a third-party package)

    def matches(self, named: str | None) -> bool:
        """Whether ``named`` (an explanation's) is one of ``model``'s alternatives (``a|b``)."""
        return named is not None and any(named == m or named.split("(")[0] == m for m in self.model.split("|"))


def _saved(path: Path, backward: bool = False):
    def load(device):
        from flashcheck.inputs.case import load_case
        from flashcheck.judge.backward import upstream_gradient

        case = load_case(path)
        return case, (upstream_gradient(case, device) if backward else None)
    return load


def _cancelling(device):
    case, do = cancelling_group_case()
    return case, do.to(device)


def _cpu_flash_overflow(device):
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, n, 128, generator=g).mul(0.3).half() for n in (65, 3))
    v = (torch.randn(1, 1, 3, 128, generator=g).sign() * 68).half()
    do = v[:, :, :1].expand(1, 1, 65, 128).contiguous()
    return AttentionCase.create(q, k, v, scale=128 ** -0.5, causal="top_left"), do.to(device)


F16 = torch.float16


def _near_tied_large_logits(scale: float) -> AttentionCase:
    # q.k ~ 1024 (fp16's spacing 1 there; products near 64, spacing 2^-5) while the keys differ by a few units.
    gen = torch.Generator().manual_seed(6)
    q = (8 + 0.1 * torch.randn(1, 2, 16, 16, generator=gen)).to(F16)
    k = (8 + 0.1 * torch.randn(1, 2, 64, 16, generator=gen)).to(F16)
    v = torch.randn(1, 2, 64, 16, generator=gen).to(F16)
    return AttentionCase.create(q, k, v, scale=scale)


def _random_fp32() -> AttentionCase:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen) for n in (16, 64, 64))
    return AttentionCase.create(q, k, v, scale=0.25)


def _hidden_keys_far_above() -> AttentionCase:
    # Logits +40,000 on keys 0..15, which the mask hides from every row, and -40,000 on keys 16..31, some of them
    # visible: a hidden key's logit less 65,504 is still 14,496 above every visible one.
    gen = torch.Generator().manual_seed(2)
    q = torch.full((1, 1, 16, 16), 100.0)
    k = torch.full((1, 1, 32, 16), 100.0)
    k[:, :, 16:] = -100.0
    v = torch.randn(1, 1, 32, 16, generator=gen)
    mask = torch.rand(1, 1, 16, 32, generator=gen) < 0.5
    mask[..., :16] = False
    mask[..., 16] = True
    return AttentionCase.create(q.to(F16), k.to(F16), v.to(F16), scale=0.25, attn_mask=mask)


def _cancelling_rows(v: float, scale: float) -> tuple[AttentionCase, torch.Tensor]:
    # K = 0 (P = 1/2 on both keys), V = +-v, dO = 12.5 and two query rows of opposite signs: dS = +-100 v on each
    # row, so dQ = 0 and dK = scale (dS_0 - dS_1) = 0 exactly, whatever dS and scale x dS are.
    q = torch.ones(1, 1, 2, 16)
    q[:, :, 1] = -1.0
    k = torch.zeros(1, 1, 2, 16)
    values = torch.tensor([v, -v]).reshape(1, 1, 2, 1).expand(1, 1, 2, 16).contiguous()
    do = torch.full((1, 1, 2, 16), 12.5, dtype=F16)
    return AttentionCase.create(q.to(F16), k.to(F16), values.to(F16), scale=scale), do


def _peaked_subnormal_p() -> AttentionCase:
    # One key at logit 0, 31 at logit gaps of 10 to 16 (P from 4.5e-5 down to 1.1e-7: fp16's subnormals), and dO
    # along O (the "aligned" regime), so dS = P (dP - D) of the tiny weights carries their rounding.
    gen = torch.Generator().manual_seed(5)
    gaps = 10 + 6 * torch.rand(32, generator=gen)
    gaps[0] = 0.0
    q = torch.ones(1, 1, 8, 16)
    k = (-gaps / 4).view(1, 1, 32, 1).expand(1, 1, 32, 16).contiguous()
    v = torch.randn(1, 1, 32, 16, generator=gen)
    case = AttentionCase.create(q.to(F16), k.to(F16), v.to(F16), scale=0.25)
    return backward_case(case, upstream="aligned", seed=5)


def _sentinel_case():
    """A bias of -inf entries that hides every key of row 0 (of both batch entries): a finite sentinel gives that
    row the mean of V, where the kernel promises 0."""
    from flashcheck.features.variant import Variant

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 16, generator=g) for n in (33, 45, 45))
    bias = torch.randn(2, 1, 33, 45, generator=g)
    bias[torch.rand(bias.shape, generator=g) < 0.3] = float("-inf")
    bias[:, :, 0] = float("-inf")
    return AttentionCase.create(q, k, v, scale=0.25, variant=Variant(attn_bias=bias))


@dataclass(frozen=True)
class Exposure:
    """A planted bug's exposing case (and its dO where the case's own upstream regime cannot give it), the block
    size both kernels run with, and the model's fit :func:`flashcheck.defects.explain` must name first."""

    named: str
    case: Callable
    block: int = 16


# The defect models' own planted bugs (kernels/triton/planted_defects.py).
DEFECT_EXPOSURES = {
    "qk_products_in_input_dtype": Exposure("products_in(fp16)", lambda: _near_tied_large_logits(0.25)),
    "qk_sum_in_input_dtype": Exposure("sums_in(fp16,in order)", lambda: _near_tied_large_logits(0.25)),
    "scores_rounded_then_promoted": Exposure("scores_rounded(fp16)", lambda: _near_tied_large_logits(0.25)),
    # A scale that is not a power of two: scale x q rounds.
    "q_prescaled_in_input_dtype": Exposure("q_prescaled(fp16)", lambda: _near_tied_large_logits(0.3)),
    # fp32 under the strict contract: the flash contract's tf32 allows fp16's rounding of l.
    "row_sum_rounded_to_fp16": Exposure("sum_rounded(fp16)", _random_fp32),
    "finite_mask_sentinel": Exposure("finite_sentinel(65504)", _hidden_keys_far_above),
    # scale x dS = +-80,000, past fp16's 65,504; dS itself 5,000.
    "scaled_ds_rounded_to_input_dtype": Exposure("scaled_ds_rounded(fp16)", lambda: _cancelling_rows(50.0, 16.0)),
    "p_rounded_for_ds": Exposure("p_rounded_for_ds(fp16)", _peaked_subnormal_p),
    # Each query head's dK share +-120,000 (past 65,504), the exact dK 0 (reports/gqa-share-2026-12-04).
    "group_shares_rounded": Exposure("group_share_rounded(fp16)", cancelling_group_case),
    # dS = +-100,000, past fp16's 65,504; scale x dS 6,250.
    "ds_rounded_to_fp16": Exposure("ds_rounded(fp16)", lambda: _cancelling_rows(1000.0, 1 / 16)),
    "q_prescaled_sum_in_input_dtype": Exposure("prescaled_sums_in(fp16,in order)",
                                               lambda: _near_tied_large_logits(0.3)),
    # The running sum: +120,000 is inf, and stays inf after the other head's -120,000.
    "group_sum_in_input_dtype": Exposure("group_sum_rounded(fp16)", cancelling_group_case),
}


def planted_probe(bug: str) -> tuple:
    """(case, dO or None, block size) of a planted bug's exposing input: the defect models' own, or the mutant tests'
    probes, which run at input_precision "ieee" (fp32 under the strict contract)."""
    from tests.interpreter import test_backward_mutants as backward_probes
    from tests.interpreter import test_mutants as forward_probes

    if bug in DEFECT_EXPOSURES:
        made = DEFECT_EXPOSURES[bug].case()
        case, do = made if isinstance(made, tuple) else (made, None)
        return case, do, DEFECT_EXPOSURES[bug].block
    if bug in forward_probes.PROBES:
        probe = forward_probes.PROBES[bug]()
        return probe.case, None, probe.block_n
    if bug in backward_probes.PROBES:
        probe = backward_probes.PROBES[bug]
        case = backward_case(backward_probes._case(probe), upstream=probe.upstream, seed=1)
        return case, None, backward_probes.BLOCK
    if bug == "bias_finite_sentinel":
        return _sentinel_case(), None, 16
    raise KeyError(bug)


def explain_planted(bug: str, device: str):
    """The defect models' explanation of a planted bug of flashcheck:triton on its exposing input, on ``device``."""
    from flashcheck.defects import explain
    from flashcheck.kernels.triton.mutants import load_mutant

    case, do, block = planted_probe(bug)
    kernel = load_mutant(bug, block_m=block, block_n=block, input_precision="ieee")
    return explain(kernel, case, device=device, do=do)


def planted() -> list[tuple[str, str]]:
    """(model, bug) for each planted bug of flashcheck:triton a model names."""
    from flashcheck.defects import MODELS

    return [(m.name, p.split("~")[1]) for m in MODELS for p in m.planted if p.startswith("flashcheck:triton~")]


_FLA = REPORTS / "serving-2026-12-03" / "h200" / "fla-decoding-cases"
_SGLANG = REPORTS / "mla-2026-12-06" / "sglang-h100-run2" / "cases"
_SIGNOFF = REPORTS / "signoff-h200-2026-12-04" / "corpus"

REAL = (
    KnownDefect("PyTorch CPU flash backward: dS in fp16 past 65,504", "torch:flash", _cpu_flash_overflow,
                "ds_rounded(fp16)", devices=("cpu",)),
    KnownDefect("PyTorch CPU flash backward: GQA's running dK sum in fp16", "torch:flash", _cancelling,
                "group_sum_rounded(fp16)", devices=("cpu",)),
    KnownDefect("PyTorch flash (FA2) backward: dS in fp16 past 65,504", "torch:flash",
                _saved(SDPA_CASES / "flash_fp16_ds_overflow.json", True), "ds_rounded(fp16)"),
    KnownDefect("PyTorch efficient backward: scale x dS in fp16 past 65,504", "torch:efficient",
                _saved(SDPA_CASES / "efficient_fp16_scaled_ds_overflow.json", True), "scaled_ds_rounded(fp16)"),
    KnownDefect("PyTorch efficient backward: scale x dS in fp16's subnormals", "torch:efficient",
                _saved(SDPA_CASES / "fp16_tiny_scale.json", True), "scaled_ds_rounded(fp16)"),
    KnownDefect("cuDNN backward: scale x dS in fp16's subnormals", "torch:cudnn",
                _saved(SDPA_CASES / "fp16_tiny_scale.json", True), "scaled_ds_rounded(fp16)"),
    KnownDefect("PyTorch efficient backward: dS from P rounded to fp16", "torch:efficient",
                _saved(_SIGNOFF / "torch-efficient-backward" / "torch-efficient-over_budget-shrunk-5e5caa1ad0.json",
                       True), "p_rounded_for_ds"),
    KnownDefect("cuDNN backward: scale x dS in fp16 (peaked P)", "torch:cudnn",
                _saved(REPORTS / "signoff-h200-2026-12-01" / "corpus" / "torch-cudnn-backward" /
                       "torch-cudnn-over_budget-shrunk-5720f78cf7.json", True), "scaled_ds_rounded(fp16)"),
    *(KnownDefect(f"PyTorch {name} backward: GQA's dK shares in fp16", f"torch:{name}", _cancelling,
                  "group_share_rounded(fp16)") for name in ("flash", "efficient", "cudnn")),
    KnownDefect("cuDNN forward: a hidden key under fp16's lowest as its mask bias", "torch:cudnn",
                _saved(REPORTS / "signoff-h200-2026-12-01" / "corpus" / "torch-cudnn-forward" /
                       "torch-cudnn-over_budget-shrunk-e725839792.json"), "finite_sentinel(65504)"),
    *(KnownDefect(f"fla-core attn_decoding_one_step: scores summed in half by fused multiply-adds ({path.stem[-10:]})",
                  "fla:attn_decoding", _saved(path), "prescaled_sums_in|sums_in", needs="fla")
      for path in sorted(_FLA.glob("*.json"))),
    # On an H100 (Triton 3.6) the non-finite case's output is that of every product and partial sum in fp16, bit for
    # bit (the products alone in fp16 give another): its label says what the GPU showed.
    *(KnownDefect(f"SGLang MLA decode, one query head: {what} ({stem[-10:]})", "sglang:mla-decode",
                  _saved(_SGLANG / f"{stem}.json"), model, needs="sglang")
      for stem, what, model in (
          ("sglang-mla-decode-lse+nonfinite-shrunk-d47604f2c7", "q.k summed in the input dtype", "sums_in"),
          ("sglang-mla-decode-lse-shrunk-b95e964aef", "q.k products in the input dtype", "products_in"))),
)
