"""The inputs a reproducer rebuilds are the saved case's bits in the case's layout: the same strides and storage
offset, the same storage around the view (its NaN padding), for every layout, fp16, bf16 and fp32; and the mask,
the variant's tensors and dO too."""

from __future__ import annotations

import runpy

import pytest
import torch

from flashcheck.contract.formats import raw_bits
from flashcheck.features.variant import Variant
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.layout import Layout
from flashcheck.judge.backward import backward_case
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.repro import make_repro
from flashcheck.repro.evidence import gather

from ._repro import tensors

LAYOUTS = [("fp16", Layout.transposed()), ("bf16", Layout.strided(pad_n=3, pad_d=5)),
           ("fp32", Layout.offset(elements=7)), ("bf16", Layout.expanded()), ("fp16", Layout.contiguous())]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _storage(t: torch.Tensor) -> torch.Tensor:
    """The bits of every element of ``t``'s storage, not only of the view."""
    return raw_bits(torch.empty(0, dtype=t.dtype).set_(t.untyped_storage()))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and a.storage_offset() == b.storage_offset() and torch.equal(_storage(a), _storage(b)))


def _script_namespace(tmp_path, case, kernel="torch:math"):
    made = make_repro(resolve_kernel(kernel, device="cpu"), case, device="cpu", case_path="case.json")
    script = tmp_path / "repro.py"
    script.write_text(made.script)
    (tmp_path / "repro.npz").write_bytes(made.tensors)  # the arrays, read beside the script
    return runpy.run_path(str(script), run_name="repro_under_test")  # its functions, main not run


@pytest.mark.parametrize("dtype, layout", LAYOUTS, ids=[f"{d}-{lay}" for d, lay in LAYOUTS])
def test_the_script_rebuilds_the_case_bit_for_bit(tmp_path, dtype, layout):
    q, k, v = tensors(Hq=2, Hkv=1 if layout.name == "expanded" else 2, dtype=DTYPES[dtype], seed=4)
    mask = torch.rand(1, 2, 5, 7, generator=torch.Generator().manual_seed(5)) > 0.4
    variant = Variant(attn_bias=torch.randn(1, 2, 5, 7).to(DTYPES[dtype]))
    case = AttentionCase.create(q, k, v, scale=0.3, attn_mask=mask, layout=layout, variant=variant)
    rebuilt, kw = _script_namespace(tmp_path, case)["inputs"]("cpu")
    for name, saved in zip(("q", "k", "v", "attn_mask"), case.to_device("cpu")):
        assert _same(rebuilt[name], saved), name
    assert _same(kw["attn_bias"], case.variant.kwargs("cpu")["attn_bias"])


def test_the_script_carries_do_and_the_budgets_bit_for_bit(tmp_path):
    q, k, v = tensors(Hq=2, Hkv=2, Nq=4, Nk=4, dtype=torch.bfloat16, seed=6)
    case = backward_case(AttentionCase.create(q, k, v, scale=0.5, causal="top_left"), upstream="huge", seed=2)
    ns = _script_namespace(tmp_path, case)
    evidence = gather(resolve_kernel("torch:math", device="cpu"), case, device="cpu")
    assert torch.equal(raw_bits(ns["tensor"](ns["CASE"]["do"], "cpu")), raw_bits(evidence.do))
    for name in ("dq", "dk", "dv"):
        carried = ns["tensor"](ns["CASE"]["budgets"][name], "cpu")
        assert torch.equal(raw_bits(carried), raw_bits(evidence.tensors[name].budget))
