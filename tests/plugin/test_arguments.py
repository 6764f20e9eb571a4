"""property_test's and assert_passes's arguments: keyword-only, each refused by name with its value
and a fix; the hypothesis profiles."""

from __future__ import annotations

import inspect

import pytest

import flashcheck
from flashcheck.testing.session import PROFILES, register_profiles


@flashcheck.kernel(causal=("none",), dtypes=("fp16", "fp32"))
def attention(q, k, v, *, scale, causal, attn_mask=None):
    return q


@flashcheck.kernel(causal=("none",), dtypes=("fp16", "fp32"), backward=True)
def differentiable(q, k, v, *, scale, causal, attn_mask=None):
    return q


def test_property_test_options_are_keyword_only():
    params = inspect.signature(flashcheck.property_test).parameters
    assert list(params)[0] == "kernel"
    assert {p.name for p in params.values() if p.kind is p.KEYWORD_ONLY} == {
        "preset", "dtypes", "max_examples", "seed", "device", "backward"}


def test_property_test_is_a_collectable_test_with_one_id_per_dtype():
    test = flashcheck.property_test(attention)
    assert inspect.isfunction(test)
    marks = {m.name: m for m in test.pytestmark}
    assert "flashcheck" in marks
    assert [p.id for p in marks["parametrize"].args[1]] == ["fp16", "fp32"]
    only = flashcheck.property_test(attention, dtypes="fp32")
    assert [p.id for p in {m.name: m for m in only.pytestmark}["parametrize"].args[1]] == ["fp32"]
    both = flashcheck.property_test(differentiable, backward=True)
    assert [p.id for p in {m.name: m for m in both.pytestmark}["parametrize"].args[1]] == [
        "fp16", "fp32", "fp16-backward", "fp32-backward"]


@pytest.mark.parametrize("kwargs, argument, fix", [
    (dict(backward=True), "backward", "backward=True in its spec"),
    (dict(backward="yes"), "backward", "backward=True to test"),
    (dict(dtypes=("bf16",)), "dtypes", "dtypes=('fp16',)"),
    (dict(dtypes=()), "dtypes", "leave it out"),
    (dict(max_examples=0), "max_examples", "N >= 1"),
    (dict(max_examples=True), "max_examples", "N >= 1"),
    (dict(seed=-1), "seed", "N >= 0"),
    (dict(seed="1"), "seed", "N >= 0"),
    (dict(device="gpu"), "device", "'cuda', 'cpu'"),
    (dict(preset="no-such-preset"), "preset", "Use one of"),
    (dict(preset=3), "preset", "preset='smoke'"),
])
def test_property_test_refuses_bad_options_by_name(kwargs, argument, fix):
    with pytest.raises(flashcheck.InvalidArgument) as info:
        flashcheck.property_test(attention, **kwargs)
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument}=")
    assert repr(next(iter(kwargs.values())))[:6] in str(info.value)  # the value, echoed
    assert fix in str(info.value)


def test_property_test_refuses_a_kernel_name():
    with pytest.raises(flashcheck.InvalidArgument, match=r"kernel='torch:math'.*resolve_kernel"):
        flashcheck.property_test("torch:math")


def test_assert_passes_refuses_bad_options():
    with pytest.raises(flashcheck.InvalidArgument, match="allow_suspicious='no'"):
        flashcheck.assert_passes(attention, None, allow_suspicious="no")
    with pytest.raises(flashcheck.InvalidArgument, match="device='gpu'"):
        flashcheck.assert_passes(attention, None, device="gpu")


def test_profiles():
    from hypothesis import settings

    register_profiles()
    ci, long = settings.get_profile("flashcheck-ci"), settings.get_profile("flashcheck-long")
    assert ci.derandomize and ci.deadline is None and ci.database is None
    assert long.max_examples == PROFILES["flashcheck-long"]["max_examples"] >= 1000 and long.deadline is None
