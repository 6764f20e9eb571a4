"""AttentionCase: exact save/load, layouts, guard bands, refusals of bad files and bad arguments."""

from __future__ import annotations

import json
import math
import os
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashcheck.contract import masks
from flashcheck.contract.validation import Shapes
from flashcheck.errors import CaseFormatError, InvalidArgument
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.casefile import case_paths
from flashcheck.inputs.layout import Layout, layouts

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
INT_OF = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}

# Bit patterns of the values a round trip must not disturb: -0.0, smallest and largest subnormal,
# smallest normal, +-max, +-inf, a quiet NaN, a signalling NaN with payload, a negative NaN with payload.
SPECIAL_BITS = {
    torch.float16: [0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE5A],
    torch.bfloat16: [0x8000, 0x0001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFA5],
    torch.float32: [0x80000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000,
                    0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC12345],
}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(INT_OF[t.dtype]) if t.dtype in INT_OF else t


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a).cpu(), bits(b).cpu())


def random_bits(shape, dtype, gen) -> torch.Tensor:
    """Uniformly random bit patterns: every class of value (NaN payloads included) turns up."""
    width = 16 if dtype != torch.float32 else 32
    raw = torch.randint(-(2 ** (width - 1)), 2 ** (width - 1), shape, generator=gen, dtype=torch.int64)
    return raw.to(INT_OF[dtype]).view(dtype)


def with_specials(shape, dtype, seed=0) -> torch.Tensor:
    t = random_bits(shape, dtype, torch.Generator().manual_seed(seed))
    special = [((p - (1 << 32)) if p >= 1 << 31 else p) if dtype == torch.float32 else
               ((p - (1 << 16)) if p >= 1 << 15 else p) for p in SPECIAL_BITS[dtype]]
    flat = bits(t).reshape(-1)
    flat[: len(special)] = torch.tensor(special, dtype=INT_OF[dtype])
    return t


def make(dtype=torch.float16, *, B=1, Hq=4, Hkv=2, Nq=5, Nk=7, D=8, Dv=6, seed=0, same_heads=False, **kw):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Nq, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, Nk, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, Nk, Dv, generator=g).to(dtype)
    if same_heads:
        k, v = k[:, :1].repeat(1, Hkv, 1, 1), v[:, :1].repeat(1, Hkv, 1, 1)
    kw.setdefault("scale", 0.125)
    return AttentionCase.create(q, k, v, **kw)


def storage_of(t: torch.Tensor) -> torch.Tensor:
    """The whole buffer under a view, as a 1-d tensor: what a kernel reading out of bounds would see."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())


def used_offsets(t: torch.Tensor) -> torch.Tensor:
    """Storage index of every element of the view."""
    idx = torch.tensor(t.storage_offset())
    for size, stride in zip(t.shape, t.stride()):
        idx = idx.unsqueeze(-1) + torch.arange(size) * stride
    return idx.reshape(-1)


# ---- round trips ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_round_trip_is_bit_exact_with_special_values(tmp_path, dtype):
    q = with_specials((2, 4, 5, 8), dtype, 1)
    k = with_specials((2, 2, 7, 8), dtype, 2)
    v = with_specials((2, 2, 7, 3), dtype, 3)
    mask = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(4)) > 0.5
    case = AttentionCase.create(q, k, v, scale=1 / math.sqrt(80), causal="bottom_right", attn_mask=mask,
                                layout=Layout.strided(pad_n=1, pad_d=3), provenance={"seed": 7})
    npz_path, json_path = case.save(tmp_path / "case")
    back = AttentionCase.load(json_path)
    assert back.equal_bits(case)
    for name, original in (("q", q), ("k", k), ("v", v)):
        assert same_bits(getattr(back, name), original)
    assert torch.signbit(back.q.reshape(-1)[0]) and back.q.reshape(-1)[0] == 0  # -0.0 stays negative
    assert torch.equal(back.attn_mask, mask)
    assert back.scale.hex() == (1 / math.sqrt(80)).hex()
    assert back.causal == "bottom_right" and back.layout == Layout.strided(pad_n=1, pad_d=3)
    assert back.provenance == case.provenance
    # The stored bits are the documented numpy dtypes.
    with np.load(npz_path) as npz:
        assert npz["q"].dtype == {torch.float16: np.float16, torch.bfloat16: np.uint16,
                                  torch.float32: np.float32}[dtype]
        assert npz["attn_mask"].dtype == np.bool_ and npz["attn_mask"].shape == (2, 1, 5, 7)
        if dtype == torch.bfloat16:
            assert np.array_equal(npz["q"].view(np.int16), q.view(torch.int16).numpy())


def test_load_accepts_the_json_the_npz_or_the_stem(tmp_path):
    case = make()
    npz_path, json_path = case.save(tmp_path / "run.fp16.seed3")  # dots in the stem are kept
    assert npz_path.name == "run.fp16.seed3.npz" and json_path.name == "run.fp16.seed3.json"
    for path in (json_path, npz_path, tmp_path / "run.fp16.seed3", str(tmp_path / "run.fp16.seed3")):
        assert AttentionCase.load(path).equal_bits(case)
    # Saving to a path that already has one of the suffixes writes the same pair.
    assert case.save(str(json_path)) == (npz_path, json_path)
    assert case_paths(npz_path) == (npz_path, json_path)


def test_save_creates_directories_and_leaves_no_temporary_files(tmp_path):
    make().save(tmp_path / "a" / "b" / "case")
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["case.json", "case.npz"]
    assert (tmp_path / "a" / "b" / "case.npz").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("scale", [0.1, 1 / 3, -2.5, 5e-324, 1.7976931348623157e308, 0.0, 3])
def test_scale_round_trips_exactly(tmp_path, scale):
    make(scale=scale).save(tmp_path / "c")
    meta = json.loads((tmp_path / "c.json").read_text())
    assert meta["scale_hex"] == float(scale).hex()
    assert AttentionCase.load(tmp_path / "c").scale.hex() == float(scale).hex()


def test_json_describes_the_case(tmp_path):
    case = make(torch.bfloat16, B=2, causal="top_left", attn_mask=torch.ones(5, 7, dtype=torch.bool),
                layout="transposed", provenance={"seed": np.int64(11), "strategy": "huge_logits",
                                                 "kernel": "torch:math", "notes": "found overnight"})
    _, json_path = case.save(tmp_path / "c")
    meta = json.loads(json_path.read_text())
    assert meta["format_version"] == 1
    assert meta["dtype"] == "bf16"
    assert meta["shapes"] == {"q": [2, 4, 5, 8], "k": [2, 2, 7, 8], "v": [2, 2, 7, 6]}
    assert meta["dims"] == {"B": 2, "Hq": 4, "Hkv": 2, "Nq": 5, "Nk": 7, "D": 8, "Dv": 6}
    assert meta["scale"] == 0.125 and meta["scale_hex"] == "0x1.0000000000000p-3"
    assert meta["causal"] == "top_left"
    assert meta["attn_mask"] == {"shape": [5, 7]}
    assert meta["layout"] == {"name": "transposed", "tensors": ["q", "k", "v"]}
    prov = meta["provenance"]
    assert prov["seed"] == 11 and isinstance(prov["seed"], int)
    assert (prov["strategy"], prov["kernel"], prov["notes"]) == ("huge_logits", "torch:math", "found overnight")
    assert set(prov["versions"]) == {"flashcheck", "torch", "numpy", "triton"}
    assert prov["versions"]["torch"] == torch.__version__
    assert meta["describe"] == case.describe()


def test_provenance_versions_are_those_of_the_run_that_saved_it(tmp_path):
    old = {"flashcheck": "0.0.1", "torch": "2.5.0", "numpy": "1.26.0", "triton": None}
    make(provenance={"versions": old}).save(tmp_path / "c")
    assert AttentionCase.load(tmp_path / "c").provenance["versions"] == old


# ---- the case's own numbers -----------------------------------------------------------------------------

def test_numbers_are_a_private_contiguous_cpu_copy():
    q = torch.randn(1, 6, 2, 4).to(torch.float16).transpose(1, 2)  # (1, 2, 6, 4), not contiguous
    k = torch.randn(1, 2, 3, 4).to(torch.float16)
    v = torch.randn(1, 2, 3, 4).to(torch.float16)
    case = AttentionCase.create(q, k, v, scale=1.0)
    assert case.q.is_contiguous() and torch.equal(case.q, q)
    k.fill_(7)  # the caller reuses its buffer
    assert not bool((case.k == 7).all())


def test_numpy_inputs_are_accepted():
    g = np.random.default_rng(0)
    q, k, v = (g.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    case = AttentionCase.create(q, k, v, scale=0.5, attn_mask=np.ones((3, 3), dtype=bool))
    assert case.dtype == "fp32" and isinstance(case.q, torch.Tensor) and case.attn_mask.dtype == torch.bool


def test_shapes_dtype_and_describe():
    case = make(torch.float16, B=1, Hq=4, Hkv=2, Nq=65, Nk=130, D=64, Dv=64, causal="bottom_right",
                attn_mask=torch.ones(1, 1, 65, 130, dtype=torch.bool), layout="transposed")
    assert case.shapes == Shapes(1, 4, 2, 65, 130, 64, 64)
    assert case.dtype == "fp16" and case.torch_dtype == torch.float16
    assert case.describe() == ("fp16 B=1 Hq=4 Hkv=2 Nq=65 Nk=130 D=64 Dv=64 scale=0.125 causal=bottom_right "
                               "mask=(1,1,65,130) layout=transposed")
    assert repr(case) == f"AttentionCase({case.describe()})"
    assert "mask=none layout=strided(pad_n=3,pad_d=8)" in make(layout="strided").describe()
    assert "layout=offset(storage_offset=5,tensors=q)" in make(layout=Layout.offset(elements=5,
                                                                                    tensors="q")).describe()


@pytest.mark.parametrize("mshape", [None, (), (7,), (5, 7), (1, 1, 5, 7), (2, 1, 1, 7), (2, 4, 5, 7), (1, 4, 5, 1)])
@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
def test_mask_broadcast_shapes_are_kept_and_visible_matches_the_masks_module(tmp_path, mshape, causal):
    mask = None if mshape is None else torch.rand(mshape, generator=torch.Generator().manual_seed(1)) > 0.3
    case = make(B=2, Nq=5, Nk=7, causal=causal, attn_mask=mask)
    assert (case.attn_mask is None) == (mask is None)
    if mask is not None:
        assert tuple(case.attn_mask.shape) == mshape
    expected = masks.visible(causal, mask, (2, 4, 5, 7))
    assert torch.equal(case.visible(), expected)
    assert torch.equal(case.empty_rows(), ~expected.any(-1))
    case.save(tmp_path / "c")
    back = AttentionCase.load(tmp_path / "c")
    assert back.equal_bits(case) and torch.equal(back.visible(), expected)
    *_, device_mask = case.to_device("cpu", guard_bands=True)
    assert (device_mask is None) == (mask is None)
    if mask is not None:
        assert torch.equal(device_mask, mask) and tuple(device_mask.shape) == mshape


def test_empty_rows_with_more_queries_than_keys_and_a_masked_row():
    # bottom-right with Nq > Nk: the first Nq - Nk queries see no key.
    assert make(Nq=7, Nk=4, causal="bottom_right").empty_rows()[0, 0].tolist() == [True] * 3 + [False] * 4
    assert not make(Nq=7, Nk=4, causal="top_left").empty_rows().any()
    mask = torch.ones(1, 4, 5, 7, dtype=torch.bool)
    mask[0, 2, 3] = False
    rows = make(attn_mask=mask).empty_rows()
    assert rows.shape == (1, 4, 5) and rows.sum() == 1 and rows[0, 2, 3]


def test_equal_bits_tells_cases_apart():
    a = make(seed=1)
    assert a.equal_bits(make(seed=1)) and not a.equal_bits(make(seed=2))
    assert not a.equal_bits(make(seed=1, scale=0.25)) and not a.equal_bits(make(seed=1, causal="top_left"))
    assert not a.equal_bits(make(seed=1, attn_mask=torch.ones(5, 7, dtype=torch.bool)))
    z = make(seed=1)
    object.__setattr__(z, "q", z.q.clone())
    z.q.view(-1)[0] = -z.q.view(-1)[0] if z.q.view(-1)[0] != 0 else -0.0  # one sign bit
    assert not a.equal_bits(z) and not a.equal_bits("a case")


# ---- layouts ----------------------------------------------------------------------------------------------

def test_layout_names():
    assert layouts() == ("contiguous", "transposed", "strided", "expanded", "offset")
    assert make().applicable_layouts() == ("contiguous", "transposed", "strided", "offset")
    assert make(same_heads=True).applicable_layouts() == layouts()


def _materialised(case, layout, **kw):
    q, k, v, _ = case.to_device("cpu", layout=layout, **kw)
    for got, want in ((q, case.q), (k, case.k), (v, case.v)):
        assert same_bits(got, want)
    return q, k, v


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_contiguous_layout(dtype):
    q, k, v = _materialised(make(dtype), "contiguous")
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    assert q.storage_offset() == 0 and q.stride() == (4 * 5 * 8, 5 * 8, 8, 1)


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_transposed_layout(dtype):
    q, k, v = _materialised(make(dtype, B=2), "transposed")
    assert q.stride() == (5 * 4 * 8, 8, 4 * 8, 1) and v.stride() == (7 * 2 * 6, 6, 2 * 6, 1)
    for t in (q, k, v):
        assert not t.is_contiguous() and t.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("pad_n,pad_d", [(3, 8), (0, 1), (2, 0)])
def test_strided_layout(pad_n, pad_d):
    case = make(torch.bfloat16, B=2)
    q, k, v = _materialised(case, Layout.strided(pad_n=pad_n, pad_d=pad_d))
    for t in (q, k, v):
        B, H, N, D = t.shape
        assert t.stride() == (H * (N + pad_n) * (D + pad_d), (N + pad_n) * (D + pad_d), D + pad_d, 1)
        assert not t.is_contiguous()
        # The gaps between rows and heads hold NaN: a kernel assuming contiguity reads NaN.
        flat = storage_of(t)
        gap = torch.ones(flat.numel(), dtype=torch.bool)
        gap[used_offsets(t)] = False
        assert gap.sum() == B * H * ((N + pad_n) * (D + pad_d) - N * D)
        assert flat[gap].isnan().all()


def test_expanded_layout_gives_stride_zero_heads_for_identical_heads():
    case = make(same_heads=True, layout="expanded")
    q, k, v, _ = case.to_device("cpu")
    assert same_bits(k, case.k) and same_bits(v, case.v) and same_bits(q, case.q)
    assert k.stride(1) == 0 and v.stride(1) == 0 and q.is_contiguous()
    assert storage_of(k).numel() == 1 * 7 * 8  # one head stored per batch entry
    q = torch.ones(1, 2, 5, 8, dtype=torch.float16)  # heads of q identical too
    both = AttentionCase.create(q, case.k, case.v, scale=1.0, layout=Layout.expanded(tensors=("q", "k")))
    q, k, v, _ = both.to_device("cpu")
    assert q.stride(1) == 0 and k.stride(1) == 0 and v.is_contiguous() and same_bits(q, both.q)


def test_expanded_layout_is_refused_when_heads_differ():
    case = make()
    with pytest.raises(InvalidArgument, match=r"^layout='expanded': the heads of k are not bit-identical.*Use"):
        case.to_device("cpu", layout="expanded")
    with pytest.raises(InvalidArgument, match=r"^layout='expanded': the heads of k are not bit-identical"):
        make(layout="expanded")
    # Heads equal as numbers but not as bits (0.0 versus -0.0) are not identical either.
    k = torch.zeros(1, 2, 3, 4, dtype=torch.float16)
    k[:, 1] = -0.0
    with pytest.raises(InvalidArgument, match="heads of k"):
        AttentionCase.create(k, k, k.clone().fill_(1), scale=1.0, layout="expanded")


@pytest.mark.parametrize("elements", [8, 1, 13])
def test_offset_layout(elements):
    q, k, v = _materialised(make(torch.float32), Layout.offset(elements=elements))
    for t in (q, k, v):
        assert t.storage_offset() == elements and t.is_contiguous()
        assert storage_of(t)[:elements].isnan().all()


def test_layout_applies_to_the_named_tensors_only():
    q, k, v = _materialised(make(), Layout.transposed(tensors=("q",)))
    assert not q.is_contiguous() and k.is_contiguous() and v.is_contiguous()


def test_the_case_layout_is_the_default_and_can_be_overridden():
    case = make(layout="transposed")
    assert not case.to_device("cpu")[0].is_contiguous()
    assert case.to_device(torch.device("cpu"), layout="contiguous")[0].is_contiguous()
    assert case.with_layout("offset").layout == Layout.offset() and case.layout == Layout.transposed()


def test_layout_value_object():
    for name in layouts():
        layout = Layout.parse(name)
        assert layout.name == name and Layout.parse(layout.as_dict()) == layout and Layout.parse(layout) is layout
    assert Layout.strided(pad_n=1, pad_d=2).as_dict() == {"name": "strided", "tensors": ["q", "k", "v"],
                                                          "pad_n": 1, "pad_d": 2}
    assert Layout.expanded().tensors == ("k", "v")
    assert Layout("transposed", tensors=("v", "q")).tensors == ("q", "v")  # canonical order
    assert hash(Layout.offset(elements=3)) == hash(Layout.offset(elements=3))


@pytest.mark.parametrize("make_layout,name,problem", [
    (lambda: Layout.parse("diagonal"), "layout", "unknown layout"),
    (lambda: Layout("diagonal"), "layout", "unknown layout"),
    (lambda: Layout.parse(3), "layout", "expected a layout name"),
    (lambda: Layout.parse({"name": "strided", "pad": 3}), "layout", "unknown keys ['pad']"),
    (lambda: Layout.parse({"pad_n": 3}), "layout", "no 'name' key"),
    (lambda: Layout.transposed(tensors=("q", "o")), "tensors", "subset of ('q', 'k', 'v')"),
    (lambda: Layout.transposed(tensors=()), "tensors", "subset of ('q', 'k', 'v')"),
    (lambda: Layout.strided(pad_n=-1), "pad_n", "whole number N, N >= 0"),
    (lambda: Layout.strided(pad_d=2.5), "pad_d", "whole number N, N >= 0"),
    (lambda: Layout.strided(pad_n=0, pad_d=0), "pad_d", "no padding is contiguous"),
    (lambda: Layout("transposed", pad_d=4), "pad_d", "padding applies to the strided layout"),
    (lambda: Layout.offset(elements=0), "storage_offset", "needs an offset"),
    (lambda: Layout.offset(elements=True), "storage_offset", "whole number N, N >= 0"),
    (lambda: Layout("contiguous", storage_offset=2), "storage_offset", "applies to the offset layout"),
])
def test_bad_layouts(make_layout, name, problem):
    with pytest.raises(InvalidArgument, match=rf"^{name}=") as info:
        make_layout()
    assert problem in str(info.value) and info.value.fix


# ---- guard bands ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "offset", "expanded"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_guard_bands_surround_each_tensor_with_nan(layout, dtype):
    case = make(dtype, same_heads=True)
    q, k, v = _materialised(case, layout, guard_bands=True)
    for t in (q, k, v):
        flat = storage_of(t)
        used = used_offsets(t)
        first, last = int(used.min()), int(used.max())
        # At least a 128-row tile of NaN on each side.
        assert first >= 128 * t.shape[-1] and flat.numel() - 1 - last >= 128 * t.shape[-1]
        assert flat[:first].isnan().all() and flat[last + 1:].isnan().all()
        # Reading one element past either end (what an unmasked tail tile does) gives NaN.
        assert flat[first - 1].isnan() and flat[last + 1].isnan()


def test_to_device_returns_fresh_memory_even_on_the_cpu():
    case = make(attn_mask=torch.ones(5, 7, dtype=torch.bool))
    q, k, v, mask = case.to_device("cpu")
    q.fill_(0), mask.fill_(False)  # a kernel scribbling over its inputs
    assert case.q.any() and case.attn_mask.all()


def test_guard_band_width_can_be_given_in_elements():
    q, k, v, _ = make().to_device("cpu", guard_bands=7)
    assert q.storage_offset() == 7 and storage_of(q).numel() == 7 + q.numel() + 7
    assert storage_of(q)[:7].isnan().all() and storage_of(q)[-7:].isnan().all()
    q, *_ = make().to_device("cpu", guard_bands=False)
    assert storage_of(q).numel() == q.numel()


# ---- bad files --------------------------------------------------------------------------------------------

@pytest.fixture
def saved(tmp_path):
    npz_path, json_path = make(torch.bfloat16, attn_mask=torch.ones(5, 7, dtype=torch.bool)).save(tmp_path / "c")
    return npz_path, json_path


def edit_json(json_path, change):
    meta = json.loads(json_path.read_text())
    change(meta)
    json_path.write_text(json.dumps(meta))


def test_missing_files(tmp_path, saved):
    npz_path, json_path = saved
    with pytest.raises(CaseFormatError, match=r"nothing\.json'?: file not found"):
        AttentionCase.load(tmp_path / "nothing")
    npz_path.unlink()
    with pytest.raises(CaseFormatError, match=r"c\.npz'?: file not found\. A saved case is a \.json and a \.npz"):
        AttentionCase.load(json_path)
    json_path.unlink()
    with pytest.raises(CaseFormatError, match=r"c\.json'?: file not found"):
        AttentionCase.load(npz_path)


def test_truncated_npz_is_caught_by_its_hash_or_as_corrupt(saved):
    npz_path, json_path = saved
    npz_path.write_bytes(npz_path.read_bytes()[:100])
    with pytest.raises(CaseFormatError, match="SHA-256 differs"):
        AttentionCase.load(json_path)
    edit_json(json_path, lambda m: m.pop("npz_sha256"))
    with pytest.raises(CaseFormatError, match=r"corrupt npz \(BadZipFile"):
        AttentionCase.load(json_path)
    npz_path.write_bytes(b"")
    with pytest.raises(CaseFormatError, match="corrupt npz"):
        AttentionCase.load(json_path)


def test_npz_of_another_case_is_refused(tmp_path, saved):
    npz_path, json_path = saved
    other_npz, _ = make(seed=9).save(tmp_path / "other")
    npz_path.write_bytes(other_npz.read_bytes())
    with pytest.raises(CaseFormatError, match="belongs to another case"):
        AttentionCase.load(json_path)


@pytest.mark.parametrize("text,problem", [
    ("{not json", "unreadable JSON"),
    ("", "unreadable JSON"),
    ("[]", "not a flashcheck case"),
    ('{"format": "something-else"}', "not a flashcheck case"),
])
def test_unreadable_json(saved, text, problem):
    saved[1].write_text(text)
    with pytest.raises(CaseFormatError, match=problem):
        AttentionCase.load(saved[1])


def test_binary_garbage_json(saved):
    saved[1].write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CaseFormatError, match="unreadable JSON"):
        AttentionCase.load(saved[1])


@pytest.mark.parametrize("change,problem", [
    (lambda m: m.update(format_version=6), "format_version 6 is newer than this flashcheck's 5"),
    (lambda m: m.update(format_version="1"), "format_version='1' is not an integer"),
    (lambda m: m.update(format_version=0), "not a known version"),
    (lambda m: m.pop("dtype"), "missing key 'dtype'"),
    (lambda m: m.pop("scale_hex"), "missing key 'scale_hex'"),
    (lambda m: m.update(dtype="fp64"), "dtype 'fp64' is not one of"),
    (lambda m: m.update(dtype="fp16"), "q is stored as uint16; a fp16 case stores float16"),
    (lambda m: m["shapes"].update(q=[1, 4, 5, 9]), r"q has shape \[1, 4, 5, 8\]; the JSON says \[1, 4, 5, 9\]"),
    (lambda m: m["shapes"].update(v="big"), "'shapes' must map q, k and v to lists of ints"),
    (lambda m: m.update(attn_mask=None), r"arrays \['attn_mask', 'k', 'q', 'v'\] found; expected \['q', 'k', 'v'\]"),
    (lambda m: m.update(attn_mask={"shape": [1, 5, 7]}), r"attn_mask has shape \[5, 7\]; the JSON says"),
    (lambda m: m.update(attn_mask=[5, 7]), "'attn_mask' must be null or"),
    (lambda m: m.update(scale_hex="0x1p-2"), "scale=0.125 disagrees with scale_hex='0x1p-2'"),
    (lambda m: m.update(scale_hex="eighth"), "is not a float.hex"),
    (lambda m: (m.update(scale_hex="inf"), m.pop("scale")), "scale inf is not finite"),
    (lambda m: m.update(layout={"name": "diagonal"}), "bad layout: layout='diagonal': unknown layout"),
    (lambda m: m.update(causal="sideways"), "not a valid input: causal='sideways'"),
])
def test_inconsistent_json(saved, change, problem):
    edit_json(saved[1], change)
    with pytest.raises(CaseFormatError, match=problem) as info:
        AttentionCase.load(saved[0])
    assert str(info.value).startswith("saved case ")


def test_hand_edited_scale_is_honoured_when_both_fields_agree(saved):
    edit_json(saved[1], lambda m: m.update(scale=0.25, scale_hex=(0.25).hex()))
    assert AttentionCase.load(saved[1]).scale == 0.25


def test_a_crash_between_the_two_writes_never_yields_a_mismatched_case(tmp_path, monkeypatch):
    old = make(seed=1)
    old.save(tmp_path / "c")
    real_replace = os.replace

    def crash_on_json(src, dst):
        if str(dst).endswith(".json"):
            raise KeyboardInterrupt("power cut")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_json)
    with pytest.raises(KeyboardInterrupt):
        make(seed=2).save(tmp_path / "c")
    monkeypatch.setattr(os, "replace", real_replace)
    assert sorted(os.listdir(tmp_path)) == ["c.json", "c.npz"]  # the temporary file was removed
    # New npz next to the old JSON: refused rather than replayed as a chimera.
    with pytest.raises(CaseFormatError, match="SHA-256 differs"):
        AttentionCase.load(tmp_path / "c")


# ---- bad arguments ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,name,problem", [
    ({"scale": math.nan}, "scale", "must be finite"),
    ({"scale": "0.1"}, "scale", "expected a real number"),
    ({"causal": True}, "causal", "unknown causal alignment"),
    ({"attn_mask": torch.ones(5, 7)}, "attn_mask", "expected a boolean mask"),
    ({"attn_mask": torch.ones(5, 6, dtype=torch.bool)}, "attn_mask", "does not broadcast"),
    ({"layout": "diagonal"}, "layout", "unknown layout"),
    ({"layout": 3}, "layout", "expected a layout name"),
    ({"provenance": ["seed", 3]}, "provenance", "expected a dict with string keys"),
    ({"provenance": {1: "x"}}, "provenance", "expected a dict with string keys"),
    ({"provenance": {"seed": object()}}, "provenance", "not JSON serialisable"),
    ({"provenance": {"loss": math.inf}}, "provenance", "not JSON serialisable"),
])
def test_create_refuses_bad_arguments_by_name(kwargs, name, problem):
    with pytest.raises(InvalidArgument, match=rf"^{name}=.*{problem}") as info:
        make(**kwargs)
    assert info.value.argument == name and info.value.fix


def test_create_refuses_bad_tensors_by_name():
    q = torch.zeros(1, 3, 5, 8, dtype=torch.float16)
    k = torch.zeros(1, 2, 7, 8, dtype=torch.float16)
    with pytest.raises(InvalidArgument, match=r"^k=.*not a multiple"):
        AttentionCase.create(q, k, k, scale=1.0)
    with pytest.raises(InvalidArgument, match=r"^q\.dtype=torch\.float64"):
        AttentionCase.create(q.double(), k.double(), k.double(), scale=1.0)


@pytest.mark.parametrize("kwargs,name", [
    ({"device": "warp-drive"}, "device"),
    ({"device": 3.5}, "device"),
    ({"layout": "diagonal"}, "layout"),
    ({"guard_bands": -1}, "guard_bands"),
    ({"guard_bands": "yes"}, "guard_bands"),
])
def test_to_device_refuses_bad_arguments_by_name(kwargs, name):
    with pytest.raises(InvalidArgument, match=rf"^{name}=") as info:
        make().to_device(**kwargs)
    assert info.value.fix


@pytest.mark.parametrize("path", [None, 3, ["a"]])
def test_load_and_save_refuse_a_non_path(path):
    with pytest.raises(InvalidArgument, match=r"^path="):
        AttentionCase.load(path)
    with pytest.raises(InvalidArgument, match=r"^path="):
        make().save(path)


# ---- the property: save -> load -> to_device preserves every bit -------------------------------------------

@st.composite
def layouts_drawn(draw):
    name = draw(st.sampled_from(layouts()))
    tensors = draw(st.sets(st.sampled_from(("q", "k", "v")), min_size=1))
    if name == "strided":
        pad_n, pad_d = draw(st.tuples(st.integers(0, 3), st.integers(0, 9)).filter(lambda p: p != (0, 0)))
        return Layout.strided(pad_n=pad_n, pad_d=pad_d, tensors=tensors)
    if name == "offset":
        return Layout.offset(elements=draw(st.integers(1, 17)), tensors=tensors)
    return Layout(name, tensors=tensors)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(list(DTYPES.values())),
    dims=st.tuples(st.integers(1, 2), st.integers(1, 2), st.integers(1, 3), st.integers(1, 6), st.integers(1, 6),
                   st.integers(1, 5), st.integers(1, 5)),
    causal=st.sampled_from(["none", "top_left", "bottom_right"]),
    mask_kind=st.sampled_from([None, "rows_cols", "full", "keys"]),
    layout=layouts_drawn(),
    guard=st.sampled_from([False, True, 3]),
    scale=st.floats(allow_nan=False, allow_infinity=False),
    seed=st.integers(0, 2**32 - 1),
)
def test_save_load_to_device_preserves_bits(dtype, dims, causal, mask_kind, layout, guard, scale, seed):
    B, Hkv, group, Nq, Nk, D, Dv = dims
    Hq = Hkv * group
    g = torch.Generator().manual_seed(seed)
    q = random_bits((B, Hq, Nq, D), dtype, g)
    k = random_bits((B, Hkv, Nk, D), dtype, g)
    v = random_bits((B, Hkv, Nk, Dv), dtype, g)
    if layout.name == "expanded":  # the layout needs bit-identical heads
        q, k, v = (t[:, :1].expand_as(t) if n in layout.tensors else t for n, t in zip("qkv", (q, k, v)))
    mshape = {None: None, "rows_cols": (Nq, Nk), "full": (B, Hq, Nq, Nk), "keys": (B, 1, 1, Nk)}[mask_kind]
    mask = None if mshape is None else torch.rand(mshape, generator=g) > 0.5
    case = AttentionCase.create(q, k, v, scale=scale, causal=causal, attn_mask=mask, layout=layout,
                                provenance={"seed": seed, "strategy": "property"})
    with tempfile.TemporaryDirectory() as tmp:
        _, json_path = case.save(os.path.join(tmp, "case"))
        back = AttentionCase.load(json_path)
    assert back.equal_bits(case) and back.layout == layout and back.provenance == case.provenance
    assert back.scale.hex() == float(scale).hex()
    dq, dk, dv, dmask = back.to_device("cpu", guard_bands=guard)
    for got, want in ((dq, q), (dk, k), (dv, v)):
        assert same_bits(got, want)
    assert (dmask is None and mask is None) or torch.equal(dmask, mask)
    if layout.name == "expanded" and Hkv > 1 and "k" in layout.tensors:
        assert dk.stride(1) == 0
