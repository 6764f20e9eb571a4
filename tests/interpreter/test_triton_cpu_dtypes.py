"""On the CPU, flashcheck's own Triton kernel runs under the Triton interpreter, whose bf16 tl.dot is
wrong: the kernel (its tile options and planted-bug variants too) does not claim bf16 there, so a
campaign does not draw it and an explicit bf16 is a usage error that says why. A user's kernel keeps
its own spec."""

from __future__ import annotations

import dataclasses

import pytest

import flashcheck
from flashcheck.campaign.config import CampaignConfig, Target
from flashcheck.campaign.run import run_campaign
from flashcheck.campaign.setup import prepare_campaign
from flashcheck.cli import main
from flashcheck.errors import InvalidArgument
from flashcheck.inputs.presets import load_preset
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.selftest.config import SelftestConfig
from flashcheck.selftest.run import selftest_plan

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("name", ["flashcheck:triton", "flashcheck:triton[block_m=32,block_n=16]",
                                  "flashcheck:triton~acc_rescale_forgotten[block_m=16,block_n=16]"])
def test_on_the_cpu_the_builtin_triton_kernel_does_not_claim_bf16(name):
    assert resolve_kernel(name, device="cpu").spec.dtypes == ("fp16", "fp32")


def test_a_campaign_over_a_preset_with_bf16_draws_none(tmp_path):
    # The adversarial preset's dtypes (bf16 among them) at small shapes: the interpreter takes minutes on its own.
    preset = dataclasses.replace(load_preset("adversarial"), max_n=40, head_dims=(16,), max_batch=1, max_heads=2)
    assert "bf16" in preset.dtypes
    result = run_campaign(CampaignConfig(Target("flashcheck:triton[block_m=16,block_n=16]", "cpu", preset)).replace(
        max_examples=6, seed=0, corpus=tmp_path, isolate=False, time_budget=120))
    assert result.examples > 0 and set(result.by_dtype) <= {"fp16", "fp32"}, dict(result.by_dtype)


def test_an_explicit_bf16_is_a_usage_error_naming_the_interpreter(tmp_path, capsys):
    with pytest.raises(InvalidArgument) as info:
        prepare_campaign(CampaignConfig(Target("flashcheck:triton", "cpu", load_preset("smoke"), ("bf16",))))
    assert info.value.argument == "dtype" and "bf16 tl.dot is wrong" in str(info.value)
    code = main(["fuzz", "flashcheck:triton", "--device", "cpu", "--dtype", "bf16", "--corpus", str(tmp_path),
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "dtype=['bf16']" in err and "Triton interpreter" in err and "--device cuda" in err
    assert "Traceback" not in err


def test_a_users_triton_kernel_keeps_bf16_on_the_cpu():
    @flashcheck.kernel(dtypes=("fp16", "bf16", "fp32"))
    def mine(q, k, v, *, scale, causal, attn_mask=None):
        return q

    prepared = prepare_campaign(CampaignConfig(Target(mine, "cpu", load_preset("adversarial"))))
    assert prepared.kernel.spec.dtypes == ("fp16", "bf16", "fp32") and prepared.dtypes == ["fp16", "bf16", "fp32"]


def test_the_selftest_on_the_cpu_has_no_bf16_row_of_the_triton_kernels():
    rows = selftest_plan(SelftestConfig("cpu", ("fp16", "bf16", "fp32")))
    triton = [(name, dtype) for name, dtype in rows if not name.startswith("torch:")]
    assert triton and {dtype for _, dtype in triton} == {"fp16", "fp32"}
    assert {dtype for _, dtype in selftest_plan(SelftestConfig("cpu"))} == {"fp16", "fp32"}
