"""The public surface, pinned: the contracts in docs/design.md are what other code depends on."""

from __future__ import annotations

import inspect

import flashcheck
from flashcheck.contract.spec import KernelSpec

PUBLIC = {
    "AttentionCase", "BUG", "BackendUnavailable", "CaseFormatError", "Finding", "FlashcheckError",
    "InvalidArgument", "Kernel", "KernelSpec", "PASS", "PRECISIONS", "Precision", "Reference", "SUSPICIOUS", "Variant",
    "Unsupported", "Verdict", "assert_attention_close", "assert_passes", "audit_reference", "check", "kernel",
    "property_test", "reference_attention",
    # the backward pass
    "Gradients", "audit_gradients", "check_backward", "reference_gradients",
    # split-KV merges of partial states
    "check_merge",
    # serving forms (varlen, paged)
    "ServingCase",
    # the conventions a spec declares as records: MLA's cached row, sparse index sets
    "LatentCache", "KeySets", "BlockSparse",
    # a case's key-block lists (the block-sparse convention)
    "BlockLists",
}


def test_public_names():
    assert set(flashcheck.__all__) == PUBLIC
    assert all(hasattr(flashcheck, name) for name in PUBLIC)


def test_check_merge_contract():
    params = inspect.signature(flashcheck.check_merge).parameters
    assert list(params)[0] == "merge_fn"
    assert keyword_only(flashcheck.check_merge) == {"cases", "seed", "dtype", "lse_base", "empty_lse", "max_splits",
                                                    "rows", "head_dim", "device", "convention", "save_dir"}


def keyword_only(fn) -> set[str]:
    return {p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


def test_reference_attention_contract():
    params = inspect.signature(flashcheck.reference_attention).parameters
    assert list(params)[:3] == ["q", "k", "v"]
    assert keyword_only(flashcheck.reference_attention) == {"scale", "causal", "attn_mask", "method", "dps", "rows",
                                                                "variant"}
    assert params["method"].default == "float64" and params["dps"].default == 50 and params["causal"].default == "none"
    assert {"out", "lse", "w", "bound", "empty_rows"} <= set(flashcheck.Reference.__dataclass_fields__)


def test_backward_contracts():
    params = inspect.signature(flashcheck.reference_gradients).parameters
    assert list(params)[:4] == ["q", "k", "v", "do"]
    assert keyword_only(flashcheck.reference_gradients) == {"scale", "causal", "attn_mask", "method", "dps", "variant"}
    assert list(inspect.signature(flashcheck.check_backward).parameters)[:2] == ["kernel", "case"]
    assert {"backward", "deterministic_backward"} <= set(KernelSpec.__dataclass_fields__)
    assert KernelSpec().backward is False and KernelSpec().deterministic_backward is True


def test_check_and_assert_contracts():
    assert list(inspect.signature(flashcheck.check).parameters)[:2] == ["kernel", "case"]
    assert "precision" in keyword_only(flashcheck.check)
    assert list(inspect.signature(flashcheck.assert_attention_close).parameters)[:2] == ["out", "reference"]
    assert "precision" in keyword_only(flashcheck.assert_attention_close)


def test_kernel_spec_fields_of_the_design():
    fields = set(KernelSpec.__dataclass_fields__)
    assert {"dtypes", "causal", "attn_mask", "gqa", "head_dims", "fully_masked_rows", "precision",
            "seq_multiple", "equal_lengths", "max_seqlen", "dv_equals_d"} <= fields
    assert {"form", "page_sizes", "lse_base", "empty_lse"} <= fields  # serving forms, the lse's convention
    assert set(flashcheck.PRECISIONS) >= {"flash", "strict", "upcast"}


def test_kernel_calling_convention_is_keyword_only():
    @flashcheck.kernel(causal=("none", "bottom_right"), fully_masked_rows="zero")
    def attention(q, k, v, *, scale, causal, attn_mask=None):
        return q

    assert keyword_only(attention.fn) == {"scale", "causal", "attn_mask"}
    assert attention.spec.causal == ("none", "bottom_right") and attention.spec.fully_masked_rows == "zero"


def test_submodules_are_attributes_after_a_plain_import():
    """`import flashcheck` then `flashcheck.strategies.cases(...)`, as the docs write it."""
    import subprocess
    import sys

    code = ("import flashcheck; assert callable(flashcheck.strategies.cases); "
            "assert callable(flashcheck.masks.causal); assert callable(flashcheck.check)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_short_submodule_names_import_the_modules_where_they_live():
    import importlib

    for short, where in flashcheck.SUBMODULES.items():
        module = importlib.import_module(f"flashcheck.{short}")
        assert module is importlib.import_module(f"flashcheck.{where}") is getattr(flashcheck, short)
        assert module.__name__ == f"flashcheck.{where}"
    from flashcheck.strategies import cases

    from flashcheck.inputs.recipe_draws import cases as where_it_lives

    assert cases is where_it_lives
