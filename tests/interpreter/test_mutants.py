"""The planted-bug variants of flashcheck:triton: they apply, they run, and each one is really a bug.

Each mutant is run under the Triton interpreter on a small input chosen to expose its defect and
compared with the correct kernel on the same tensors (same strides, same guard bands). "Exposed"
means the mutant's output (or lse) is non-finite where the correct one is finite, or sits well
outside the correct kernel's own distance from the float64 oracle; flashcheck's error budget must
then flag the mutant and pass the correct kernel on the same input.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from flashcheck.contract.validation import Shapes
from flashcheck.errors import InvalidArgument
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.layout import Layout
from flashcheck.inputs.regimes import VALUE_REGIMES
from flashcheck.judge.check import check
from flashcheck.judge.comparison import compare
from flashcheck.kernels.triton import mutants
from flashcheck.kernels.triton.forward import make_kernel
from flashcheck.kernels.triton.mutants import MutantSourceError, load_mutant, mutant_names, mutant_source
from flashcheck.kernels.triton.planted import AREAS, MUTANTS, SOURCES, Mutant
from flashcheck.kernels.triton.planted_defects import DEFECT_MUTANTS
from flashcheck.kernels.triton.planted_long import LONG_MUTANTS
from flashcheck.kernels.triton.runtime import BACKEND_NAME
from flashcheck.numerics.budget import error_budget

pytestmark = pytest.mark.interpreter

F16 = torch.float16
D = 16
BLOCK = 16
NAMES = mutant_names()


# -- static properties of the list ----------------------------------------------------------------


def test_at_least_22_mutants_with_unique_names_and_known_areas():
    assert len(MUTANTS) >= 22
    assert len(set(NAMES)) == len(NAMES) == len(MUTANTS)
    assert all(m.area in AREAS for m in MUTANTS), [m.area for m in MUTANTS if m.area not in AREAS]
    assert all(m.name.isidentifier() and m.description and m.exposed_by and m.edits for m in MUTANTS)


@pytest.mark.parametrize("name", NAMES + tuple(m.name for m in LONG_MUTANTS + DEFECT_MUTANTS))
def test_edits_apply_once_and_give_valid_python(name):
    mutant = mutants._BY_NAME[name]
    source = SOURCES[mutant.target].read_text()
    for old, new in mutant.edits:
        assert source.count(old) == 1, (name, old)
        assert old != new
    mutated = mutant_source(name)
    assert mutated != source
    compile(mutated, f"<mutant {name}>", "exec")


def test_the_long_planted_bugs_stay_out_of_the_selftest_and_change_no_bit_of_a_short_case():
    from flashcheck.selftest.subjects import subjects

    long = {m.name for m in LONG_MUTANTS}
    assert long == {"int32_offsets", "key_position_in_fp16"}
    assert not long & {s.name for device in ("cpu", "cuda") for s in subjects(device)}
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 32, generator=gen).half() for n in (17, 200, 200))
    want = make_kernel(block_m=16, block_n=16)
    for name in long:
        got = load_mutant(name, block_m=16, block_n=16)
        a, b = (kern(q, k, v, scale=0.2, causal="bottom_right") for kern in (want, got))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), name


def test_stale_edit_names_the_mutant(monkeypatch):
    broken = Mutant("stale", "bounds", "d", (("no such text", "x"),), "e")
    monkeypatch.setitem(mutants._BY_NAME, "stale", broken)
    with pytest.raises(MutantSourceError, match="stale"):
        mutant_source("stale")


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(InvalidArgument, match=NAMES[0]):
        load_mutant("no_such_mutant")
    with pytest.raises(InvalidArgument):
        mutant_source("no_such_mutant")


def test_importing_mutants_does_not_import_triton():
    code = "import sys, flashcheck.kernels.triton.mutants; assert 'triton' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_loaded_mutant_is_named_and_keeps_the_correct_spec():
    kernel = load_mutant("causal_diagonal_excluded", block_m=32, block_n=16)
    correct = make_kernel(block_m=32, block_n=16)
    assert kernel.name == f"{BACKEND_NAME}~causal_diagonal_excluded[block_m=32,block_n=16]"
    assert kernel.spec == correct.spec
    module = sys.modules["flashcheck.kernels.triton._mutant_causal_diagonal_excluded"]
    assert module.__package__ == "flashcheck.kernels.triton"
    assert load_mutant("causal_diagonal_excluded").fn is not kernel.fn  # other options, same module
    assert sys.modules["flashcheck.kernels.triton._mutant_causal_diagonal_excluded"] is module


# -- inputs --------------------------------------------------------------------------------------------


def _randn(gen, *shape, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(F16)


def _case(*, Nq=32, Nk=32, Hq=2, Hkv=None, seed=0, scale=None, causal="none", attn_mask=None,
          q=None, k=None, v=None) -> AttentionCase:
    Hkv = Hq if Hkv is None else Hkv
    gen = torch.Generator().manual_seed(seed)
    q = _randn(gen, 1, Hq, Nq, D) if q is None else q
    k = _randn(gen, 1, Hkv, Nk, D) if k is None else k
    v = _randn(gen, 1, Hkv, Nk, D) if v is None else v
    scale = 1 / math.sqrt(D) if scale is None else scale
    return AttentionCase.create(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@dataclass
class Probe:
    """An exposing input: the case, how it is laid out in memory, the tiles and what to compare."""

    case: AttentionCase
    block_m: int = BLOCK
    block_n: int = BLOCK
    layout: object = None
    guard_bands: bool = False
    mask: torch.Tensor | None = None  # passed instead of the case's own (e.g. a view with odd strides)
    compare: str = "out"

    def tensors(self):
        q, k, v, mask = self.case.to_device("cpu", layout=self.layout, guard_bands=self.guard_bands)
        return q, k, v, (mask if self.mask is None else self.mask)


def _growing_max(seed):
    # Later key tiles get larger keys, so the row max grows at (nearly) every tile.
    gen = torch.Generator().manual_seed(seed)
    growth = torch.arange(48).div(BLOCK, rounding_mode="floor").add(1.0)[:, None]
    k = (torch.randn(1, 2, 48, D, generator=gen) * growth).to(F16)
    return _case(Nq=16, Nk=48, k=k, seed=seed)


def _max_falls():
    # Key tile 0 gives logits near 256 (369 in base 2), tile 1 logits near 0: alpha = 2^369 overflows.
    gen = torch.Generator().manual_seed(3)
    q = torch.full((1, 1, 16, D), 8.0, dtype=F16)
    k = _randn(gen, 1, 1, 32, D, scale=0.5)
    k[:, :, :BLOCK] = 8.0
    return _case(Hq=1, Nq=16, Nk=32, q=q, k=k, scale=0.25)


def _empty_row_mask(Nq, Nk, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(1, 1, Nq, Nk, generator=gen) < 0.7
    mask[:, :, 3] = False
    return mask


def _large_flat_v():
    # Flat attention (q = 0) over 96 keys with |v| ~ 1000: the unnormalised sum reaches ~ 96000.
    gen = torch.Generator().manual_seed(5)
    v = (1000 + 100 * torch.rand(1, 1, 96, D, generator=gen)).to(F16)
    return _case(Hq=1, Nq=16, Nk=96, q=torch.zeros(1, 1, 16, D, dtype=F16), v=v, seed=5)


def _near_tied_large_logits():
    # q.k ~ 1024 (fp16 spacing 1 there) while the keys differ by a few units: diffuse attention whose
    # logits lose up to 0.125 when the scores are rounded to fp16.
    gen = torch.Generator().manual_seed(6)
    q = (8 + 0.1 * torch.randn(1, 2, 16, D, generator=gen)).to(F16)
    k = (8 + 0.1 * torch.randn(1, 2, 64, D, generator=gen)).to(F16)
    return _case(Nq=16, Nk=64, q=q, k=k, scale=0.25, seed=6)


def _expanded_heads():
    gen = torch.Generator().manual_seed(7)
    k = _randn(gen, 1, 1, 32, D).expand(1, 2, 32, D)
    v = _randn(gen, 1, 1, 32, D).expand(1, 2, 32, D)
    return _case(k=k, v=v, seed=7)


def _broadcast_padding_mask():
    # A (1, 1, 1, Nk) key-padding mask viewed out of a zeroed buffer as large as a full (Nq, Nk) mask,
    # so a kernel that walks rows with stride Nk reads in-bounds zeros (all hidden) rather than garbage.
    buffer = torch.zeros(32 * 32, dtype=torch.bool)
    buffer[:20] = True
    return buffer[:32].view(1, 1, 1, 32)


def _poisoned_hidden_keys():
    gen = torch.Generator().manual_seed(8)
    k = _randn(gen, 1, 2, 32, D)
    k[:, :, 24:] = float("nan")
    mask = torch.ones(1, 1, 1, 32, dtype=torch.bool)
    mask[..., 24:] = False
    return _case(k=k, attn_mask=mask, seed=8)


PROBES = {
    "acc_rescale_forgotten": lambda: Probe(_growing_max(1)),
    "sum_rescale_forgotten": lambda: Probe(_growing_max(2)),
    "max_not_carried": lambda: Probe(_max_falls()),
    "exp_instead_of_exp2": lambda: Probe(_case(seed=4)),
    "tail_keys_unmasked": lambda: Probe(_case(Nq=16, Nk=40, seed=9)),
    "tail_key_tile_skipped": lambda: Probe(_case(Nq=16, Nk=40, seed=10)),
    "tail_query_tile_dropped": lambda: Probe(_case(Nq=40, Nk=32, seed=11)),
    "v_load_out_of_bounds": lambda: Probe(_case(Nq=16, Nk=40, seed=12), guard_bands=True),
    "causal_diagonal_excluded": lambda: Probe(_case(causal="top_left", seed=13)),
    "bottom_right_wrong_sign": lambda: Probe(_case(Nq=24, Nk=40, causal="bottom_right", seed=14)),
    "causal_skip_off_by_one": lambda: Probe(_case(Nq=33, Nk=33, causal="top_left", seed=15)),
    "fully_masked_rows_nan": lambda: Probe(_case(attn_mask=_empty_row_mask(32, 32, 16), seed=16)),
    "fully_masked_rows_zero_div": lambda: Probe(_case(attn_mask=_empty_row_mask(32, 32, 17), seed=17)),
    "acc_rounded_to_fp16": lambda: Probe(_large_flat_v(), block_n=32),
    "scores_rounded_to_input_dtype": lambda: Probe(_near_tied_large_logits()),
    "p_rounded_to_bf16": lambda: Probe(_case(Nq=16, Nk=64, scale=0.1, seed=18)),
    "scale_ignored": lambda: Probe(_case(scale=0.7, seed=19)),
    "log2e_forgotten": lambda: Probe(_case(seed=20)),
    "q_row_stride_packed": lambda: Probe(_case(seed=21), layout=Layout.transposed(tensors=("q",))),
    "kv_head_stride_packed": lambda: Probe(_expanded_heads(), layout=Layout.expanded(), guard_bands=True),
    "gqa_heads_interleaved": lambda: Probe(_case(Hq=4, Hkv=2, seed=22)),
    "mask_row_stride_packed": lambda: Probe(_case(attn_mask=_broadcast_padding_mask(), seed=23),
                                            mask=_broadcast_padding_mask()),
    "additive_mask_bias": lambda: Probe(_poisoned_hidden_keys()),
    "lse_log2_units": lambda: Probe(_case(seed=24), compare="lse"),
    "lse_missing_max": lambda: Probe(_case(seed=25), compare="lse"),
}


def test_every_mutant_has_an_exposing_probe():
    assert set(PROBES) == set(NAMES)


# -- running them -----------------------------------------------------------------------------------


def _run(kernel, probe: Probe):
    q, k, v, mask = probe.tensors()
    return kernel(q, k, v, scale=probe.case.scale, causal=probe.case.causal, attn_mask=mask)


@pytest.mark.parametrize("name", NAMES)
def test_mutant_runs_and_returns_the_right_shapes(name):
    # Guard bands keep the out-of-bounds mutants reading memory that belongs to the test.
    case = _case(Nq=24, Nk=24, seed=30)
    q, k, v, _ = case.to_device("cpu", guard_bands=True)
    out, lse = load_mutant(name, block_m=BLOCK, block_n=BLOCK)(q, k, v, scale=case.scale, causal="none")
    assert out.shape == (1, 2, 24, D) and out.dtype == F16
    assert lse.shape == (1, 2, 24) and lse.dtype == torch.float32


def _gap(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want|, inf where exactly one of them is non-finite (equal infinities count as equal)."""
    got, want = got.double(), want.double()
    same = (got == want) | (got.isnan() & want.isnan())
    diff = (got - want).abs().nan_to_num(nan=math.inf, posinf=math.inf)
    return float(torch.where(same, torch.zeros_like(diff), diff).max())


def _noise(got: torch.Tensor, exact: torch.Tensor) -> float:
    """The correct kernel's own max distance from the oracle, on rows the oracle defines."""
    live = exact.isfinite()
    return float((got.double() - exact)[live].abs().max())


@functools.cache
def _outcome(name: str):
    """(probe, correct (out, lse), mutant (out, lse), error budget) of one mutant on its probe."""
    probe = PROBES[name]()
    c = probe.case
    options = dict(block_m=probe.block_m, block_n=probe.block_n)
    want = _run(make_kernel(**options), probe)  # kept alive: the mutant's outputs get fresh memory
    got = _run(load_mutant(name, **options), probe)
    # NaN sits only in hidden keys (the additive-bias probe); the oracle refuses NaN inputs, and a
    # hidden key's value changes nothing, so it gets zeros there.
    budget = error_budget(c.q, c.k.nan_to_num(0.0), c.v, scale=c.scale, causal=c.causal,
                          attn_mask=c.attn_mask if probe.mask is None else probe.mask, precision="strict")
    return probe, want, got, budget


@pytest.mark.parametrize("name", NAMES)
def test_mutant_is_exposed_by_its_probe(name):
    probe, (want_out, want_lse), (got_out, got_lse), budget = _outcome(name)
    assert torch.isfinite(want_out).all() and not torch.isnan(want_lse).any()
    ref = budget.reference
    if probe.compare == "out":
        gap, noise = _gap(got_out, want_out), _noise(want_out, ref.out)
    else:
        gap, noise = _gap(got_lse, want_lse), _noise(want_lse, ref.lse)
    assert gap > 4 * noise and gap > 0, (
        f"{name}: the mutant moved {probe.compare} by {gap:.3g}, the correct kernel's own error is "
        f"{noise:.3g}; expected exposure: {mutants._BY_NAME[name].exposed_by}")


@pytest.mark.parametrize("name", NAMES)
def test_error_model_flags_the_mutant_and_not_the_correct_kernel(name):
    # The point of the suite: flashcheck's per-element budget, not a hand tolerance, tells them apart.
    _, want, got, budget = _outcome(name)
    correct_findings, _ = compare(*want, budget, fully_masked_rows="zero")
    mutant_findings, _ = compare(*got, budget, fully_masked_rows="zero")
    assert not correct_findings, [f.summary() for f in correct_findings]
    assert mutant_findings, f"{name} passed flashcheck's budget on its probe"


@pytest.mark.parametrize("n_k", [40, 300])
def test_p_rounded_to_bf16_over_budget_in_fp32_on_coherent_p_rounding(n_k):
    # In fp32 the flash contract lets P @ V run as tf32 (P off by up to 2^-10), so bf16's 2^-8 shows only
    # when every weight rounds the same way: the coherent_p_rounding regime.
    s = Shapes(1, 2, 1, 9, n_k, 24, 40)
    q, k, v = VALUE_REGIMES["coherent_p_rounding"](torch.Generator().manual_seed(n_k), s, 3.4e38)
    case = AttentionCase.create(q, k, v, scale=1 / math.sqrt(24))
    bug = check(load_mutant("p_rounded_to_bf16", block_m=16, block_n=16), case, device="cpu", properties=(),
                envelope=False)
    correct = check(make_kernel(block_m=16, block_n=16), case, device="cpu", properties=(), envelope=False)
    assert bug.status == "BUG" and {f.kind for f in bug.findings} == {"over_budget"}, str(bug)
    assert correct.status == "PASS" and correct.max_ratio < 0.5 < 1.5 < bug.max_ratio
