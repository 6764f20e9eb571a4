"""The defects the defect models must name: every model's planted bugs (flashcheck's Triton kernel, on its
exposing input) and the real defects of third-party kernels already classified in reports/, each with the model
that explains it. Shared by the tests (tests/interpreter/test_defect_models.py, tests/unit/test_defect_models.py,
tests/gpu/test_defect_models_gpu.py) and benchmarks/defect_table.py, which prints the table of fits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

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
    from tests._cases import cancelling_group_case

    case, do = cancelling_group_case()
    return case, do.to(device)


def _cpu_flash_overflow(device):
    from flashcheck import AttentionCase

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, n, 128, generator=g).mul(0.3).half() for n in (65, 3))
    v = (torch.randn(1, 1, 3, 128, generator=g).sign() * 68).half()
    do = v[:, :, :1].expand(1, 1, 65, 128).contiguous()
    return AttentionCase.create(q, k, v, scale=128 ** -0.5, causal="top_left"), do.to(device)


def _sentinel_case():
    """A bias of -inf entries that hides every key of row 0 (of both batch entries): a finite sentinel gives that
    row the mean of V, where the kernel promises 0."""
    from flashcheck import AttentionCase
    from flashcheck.features.variant import Variant

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 16, generator=g) for n in (33, 45, 45))
    bias = torch.randn(2, 1, 33, 45, generator=g)
    bias[torch.rand(bias.shape, generator=g) < 0.3] = float("-inf")
    bias[:, :, 0] = float("-inf")
    return AttentionCase.create(q, k, v, scale=0.25, variant=Variant(attn_bias=bias))


def planted_probe(bug: str):
    """(case, block size) of a planted bug's exposing input (the mutant tests' probes)."""
    from flashcheck.judge.backward import backward_case
    from tests.interpreter import test_backward_mutants as backward_probes
    from tests.interpreter import test_mutants as forward_probes

    if bug in forward_probes.PROBES:
        probe = forward_probes.PROBES[bug]()
        return probe.case, probe.block_n
    if bug in backward_probes.PROBES:
        probe = backward_probes.PROBES[bug]
        return backward_case(backward_probes._case(probe), upstream=probe.upstream, seed=1), backward_probes.BLOCK
    if bug == "bias_finite_sentinel":
        return _sentinel_case(), 16
    raise KeyError(bug)


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
    *(KnownDefect(f"fla-core attn_decoding_one_step: scores summed in half ({path.stem[-10:]})", "fla:attn_decoding",
                  _saved(path), "sums_in|prescaled_sums_in", needs="fla") for path in sorted(_FLA.glob("*.json"))),
    *(KnownDefect(f"SGLang MLA decode, one query head: q.k products in the input dtype ({stem[-10:]})",
                  "sglang:mla-decode", _saved(_SGLANG / f"{stem}.json"), "products_in", needs="sglang")
      for stem in ("sglang-mla-decode-lse+nonfinite-shrunk-d47604f2c7", "sglang-mla-decode-lse-shrunk-b95e964aef")),
)
