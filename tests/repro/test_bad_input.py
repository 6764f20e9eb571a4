"""``flashcheck repro`` refuses bad input with exit status 2 and a message that names the argument and echoes its
value, never a traceback: a missing case, an --out it cannot write in, a kernel plain public code cannot call."""

from __future__ import annotations

from flashcheck.inputs.case import AttentionCase

from ._repro import repro, tensors


def _refused(status, errors, *parts):
    assert status == 2 and "Traceback" not in errors, errors
    assert errors.startswith("flashcheck: error: "), errors
    for part in parts:
        assert part in errors, (part, errors)


def test_a_missing_case_names_the_argument(tmp_path):
    status, _, errors = repro(tmp_path / "no-such-case.json", tmp_path / "out")
    _refused(status, errors, "CASE=", "no-such-case", "not found")
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_an_out_that_cannot_be_written_names_the_option(tmp_path):
    q, k, v = tensors()
    case = tmp_path / "case"
    AttentionCase.create(q, k, v, scale=0.3, provenance={"kernel": "torch:math"}).save(case)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    status, _, errors = repro(f"{case}.json", blocker)
    _refused(status, errors, "--out=", "a-file", "not a folder")
    status, _, errors = repro(f"{case}.json", blocker / "below")
    _refused(status, errors, "--out=", "below", "cannot write")


def test_a_kernel_without_a_public_call_is_refused_with_what_is_supported(tmp_path):
    q, k, v = tensors(dtype=__import__("torch").float32)
    case = tmp_path / "triton-case"
    AttentionCase.create(q, k, v, scale=0.3, provenance={"kernel": "flashcheck:triton",
                                                         "kernel_source": "flashcheck:triton"}).save(case)
    status, _, errors = repro(f"{case}.json", tmp_path / "out")
    _refused(status, errors, "case=", "triton-case", "flashcheck:triton", "torch:math", "torch:flex", "module:function")
    assert not (tmp_path / "out" / "repro.py").exists()


def test_a_serving_case_of_a_built_in_kernel_is_refused_with_what_is_supported(tmp_path):
    from flashcheck.inputs.packing import serving_case

    q, k, v = tensors(B=2, dtype=__import__("torch").float32)
    base = AttentionCase.create(q, k, v, scale=0.3, provenance={"kernel": "torch:varlen",
                                                                "kernel_source": "torch:varlen"})
    case = tmp_path / "varlen-case"
    serving_case(base, form="varlen", packing="ragged", pages="none", poison="huge", seed=0).save(case)
    status, _, errors = repro(f"{case}.json", tmp_path / "out")
    _refused(status, errors, "case=", "varlen-case", "torch:varlen", "built-in", "varlen, paged and split-KV")
    assert not (tmp_path / "out" / "repro.py").exists()


def test_a_serving_case_with_index_sets_is_refused_by_name(tmp_path, kernel_folder):
    from flashcheck.inputs.recipe_draws import draw_recipes
    from flashcheck.kernels.registry import resolve_kernel

    from ._repro import save_case

    spec = resolve_kernel("torch:sparse-varlen", device="cpu").spec
    recipe = next(r for r in draw_recipes(40, spec=spec, seed=0, max_n=24) if r.indices in ("sampled", "sorted"))
    path, verdict = save_case(tmp_path / "corpus", "declared_serving:sparse_varlen", recipe.build())
    assert verdict.status == "PASS", verdict
    status, _, errors = repro(path, tmp_path / "out")
    _refused(status, errors, "case=", "a varlen case with", "does not lay out as q")
    assert not (tmp_path / "out" / "repro.py").exists()
