"""seqused_k in the varlen form: a kernel that declares it gets cases whose cu_seqlens_k spans hold poisoned key slots
past each sequence's used keys; torch:varlen honours it, its planted bug that ignores it is a BUG, and saved cases
keep the slack and replay."""

from __future__ import annotations

import json

import pytest
import torch

import flashcheck
from flashcheck.cli import main
from flashcheck.errors import InvalidArgument
from flashcheck.inputs.case import AttentionCase, load_case
from flashcheck.inputs.packing import serving_case
from flashcheck.inputs.serving import ServingCase
from flashcheck.inputs.recipe_draws import draw_recipes
from flashcheck.kernels.registry import resolve_kernel

SMALL = 'description = "small varlen"\nmax_n = 40\nmax_batch = 4\nhead_dims = [16, 32]\ndtypes = ["fp16", "fp32"]\n'


def _case(dtype=torch.float16, causal="bottom_right", seed=1) -> ServingCase:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(4, 4, 9, 32, generator=gen).to(dtype)
    k, v = (torch.randn(4, 2, 40, 32, generator=gen).to(dtype) for _ in range(2))
    base = AttentionCase.create(q, k, v, scale=32 ** -0.5, causal=causal)
    return serving_case(base, form="varlen", packing="ragged", pages="none", poison="huge", seed=seed, seqused="slack")


def _fuzz(tmp_path, kernel: str, examples: int) -> tuple[int, dict]:
    preset, out = tmp_path / "small.toml", tmp_path / "summary.json"
    preset.write_text(SMALL)
    code = main(["fuzz", kernel, "--preset", str(preset), "--max-examples", str(examples), "--seed", "1", "--device",
                 "cpu", "--no-progress", "--corpus", str(tmp_path / "corpus"), "--json", str(out)])
    return code, json.loads(out.read_text())


def test_the_physical_form_spans_the_slack_and_passes_seqused_k():
    case = _case()
    inputs = case.physical("cpu")
    used, spans = case.k_lens, [n + m for n, m in zip(case.k_lens, case.k_slack)]
    assert inputs.kwargs["seqused_k"].tolist() == list(used) and inputs.kwargs["seqused_k"].dtype == torch.int32
    assert torch.diff(inputs.kwargs["cu_seqlens_k"]).tolist() == spans and inputs.kwargs["max_seqlen_k"] == max(spans)
    start = 0
    for b, (n, span) in enumerate(zip(used, spans)):
        assert torch.equal(inputs.tensors[1][start:start + n], case.k[b, :, :n].transpose(0, 1))
        slack = inputs.tensors[1][start + n:start + span].float()
        assert bool((slack.abs() >= 2.0**15).all()) and (span - n < 2 or bool((slack < 0).any()))  # both signs
        start += span


def test_torch_varlen_passes_a_campaign_with_seqused_k_cases(tmp_path):
    code, summary = _fuzz(tmp_path, "torch:varlen", 12)
    assert code == 0 and summary["verdict"] == "PASS", summary["findings"]
    assert all(summary["coverage"][d]["seqused"]["slack"] >= 1 for d in ("fp16", "fp32")), summary["coverage"]


def test_the_planted_bug_that_ignores_seqused_k_is_found(tmp_path):
    verdict = flashcheck.check("torch:varlen~ignores_seqused_k", _case(), device="cpu")
    assert verdict.status == "BUG" and "sequence" in verdict.findings[0].diagnosis, str(verdict)
    code, summary = _fuzz(tmp_path, "torch:varlen~ignores_seqused_k", 12)
    assert code == 1 and summary["verdict"] == "BUG"
    assert any("k_slack" in f["case"] for f in summary["findings"] if f["shrunk"]), summary["findings"]


def test_a_saved_case_keeps_its_slack_and_replays(tmp_path, capsys):
    case = _case(torch.bfloat16).with_provenance({"kernel": "torch:varlen~ignores_seqused_k"})
    case.save(tmp_path / "case")
    stored = json.loads((tmp_path / "case.json").read_text())["form"]
    assert stored["k_slack"] == list(case.k_slack)
    loaded = load_case(tmp_path / "case.json")
    assert isinstance(loaded, ServingCase) and loaded.equal_bits(case) and loaded.k_slack == case.k_slack
    mine, theirs = case.physical("cpu"), loaded.physical("cpu")
    for a, b in zip(mine.tensors, theirs.tensors):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert torch.equal(mine.kwargs["seqused_k"], theirs.kwargs["seqused_k"])
    assert main(["replay", str(tmp_path / "case.json"), "--device", "cpu"]) == 1  # the planted bug again
    assert "BUG" in capsys.readouterr().out
    assert flashcheck.check("torch:varlen", loaded, device="cpu").ok


def test_a_case_without_slack_is_saved_as_before():
    case = serving_case(_case().base, form="varlen", packing="ragged", pages="none", poison="huge", seed=1)
    assert case.k_slack is None and "seqused_k" not in case.physical("cpu").kwargs


def test_only_kernels_that_declare_seqused_k_draw_it():
    varlen = resolve_kernel("torch:varlen", device="cpu").spec
    assert varlen.seqused_k
    assert {r.seqused for r in draw_recipes(16, seed=2, spec=varlen, max_n=32)} == {"none", "slack"}
    without = varlen.replace(seqused_k=False)
    assert {r.seqused for r in draw_recipes(16, seed=2, spec=without, max_n=32)} == {"none"}


def test_seqused_k_is_refused_where_it_cannot_apply():
    with pytest.raises(InvalidArgument, match="^seqused_k=True.*varlen"):
        flashcheck.KernelSpec(form="paged", seqused_k=True)
    with pytest.raises(InvalidArgument, match="^k_slack="):
        ServingCase(_case().base, "varlen", [9] * 4, [3] * 4, k_slack=[1, -1, 0, 0])
    kernel = flashcheck.kernel(resolve_kernel("torch:varlen", device="cpu").fn, form="varlen", fully_masked_rows="zero")
    with pytest.raises(InvalidArgument, match="passes seqused_k"):
        flashcheck.check(kernel, _case(), device="cpu")
