"""The quantizers' casts and scales emulated in float64 (flashcheck.numerics.quantizers), audited bit for bit:
against torch's own casts for e4m3, e5m2 and e8m0, against torch.round and a float32 reference for int8, and
against exact rational arithmetic (fractions.Fraction) for e2m1, which torch cannot cast to, and for the
power-of-two scales. The audit's points: every representable value, every midpoint between neighbours, one
float64 (and one float32) ulp either side of each, the values at and past the largest, the subnormals and the
half of the smallest, +-0, NaN, +-inf and 100,000 random float64 bit patterns over the whole exponent range."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from flashcheck.errors import InvalidArgument
from flashcheck.numerics.quantizers import CODE_FORMATS, code_format, pow2_scale, round_to, to_codes

F64 = torch.float64
NAN, INF = math.nan, math.inf
DEVICES = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
FP32_MAX = float(torch.finfo(torch.float32).max)
SPECIALS = [0.0, NAN, INF, 5e-324, 2.0**-1070 * 3, 2.0**-149, 2.0**-150, 2.0**-126, 2.0**-127, 1e-300,
            FP32_MAX, 2.0**128 - 2.0**103, 2.0**128, 1e300, float(torch.finfo(F64).max)]
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # the codes 0..7 (sign apart): the OCP MX spec's table


def same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Equal as float64 values, the sign of zero included; NaN equals NaN."""
    return ((a == b) & (torch.signbit(a) == torch.signbit(b))) | (torch.isnan(a) & torch.isnan(b))


def assert_same(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor) -> None:
    ok = same(got, want)
    bad = (~ok).nonzero().flatten()[:5].tolist()
    assert bool(ok.all()), [(x[i].item().hex(), got[i].item(), want[i].item()) for i in bad]


def signed(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t, -t])


def around(t: torch.Tensor) -> torch.Tensor:
    """t and one float64 ulp either side, and one float32 ulp either side of those that are float32 values."""
    t32 = t[t.float().double() == t].float()
    steps32 = [torch.nextafter(t32, torch.full_like(t32, s)).double() for s in (INF, -INF)]
    return torch.cat([t, torch.nextafter(t, torch.full_like(t, INF)), torch.nextafter(t, torch.full_like(t, -INF)),
                      *steps32])


def random_float64(n: int, seed: int) -> torch.Tensor:
    """n float64 bit patterns drawn uniformly: both signs, every exponent (NaN and infinities among them)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2**63, 2**63 - 1, (n,), generator=g, dtype=torch.int64).view(F64)


def grid(fmt) -> torch.Tensor:
    """The nonnegative values of ``fmt`` from its fields alone: subnormals, then each binade up to its
    largest value (e8m0: the powers of two from 2^-127)."""
    p, lo = fmt.significand_bits, fmt.min_exponent
    step = 2.0 ** (lo - p + 1)
    values = [k * step for k in range(2 ** (p - 1))] if fmt.subnormals else []
    e = lo
    while 2.0**e <= fmt.max_value:
        values += [v for m in range(2 ** (p - 1), 2**p) if (v := m * 2.0 ** (e - p + 1)) <= fmt.max_value]
        e += 1
    return torch.tensor(values if fmt.zero else [v for v in values if v], dtype=F64)


def representable(name: str) -> torch.Tensor:
    """Every finite value of the format, enumerated independently of the module: from torch's codes, from
    the e2m1 bit layout, or the integers."""
    if name == "e2m1":  # s ee m: 0.m * 2^0 at e = 0, else 1.m * 2^(e - 1)
        return signed(torch.tensor([(1 + m / 2 if e else m / 2) * 2.0 ** max(e - 1, 0) for e in range(4)
                                    for m in range(2)], dtype=F64))
    if name == "int8":
        return torch.arange(-127, 128, dtype=F64)
    codes = torch.arange(256, dtype=torch.uint8).view(CODE_FORMATS[name].dtype).to(F64)
    return codes[torch.isfinite(codes)]


def audit_points(name: str, seed: int = 0) -> torch.Tensor:
    values = torch.unique(signed(representable(name)))
    top, below = values[-1].item(), values[-2].item()
    past = torch.tensor([top, 2 * top - below, 1.5 * top - 0.5 * below, 2 * top, 4 * top, 1.75 * top], dtype=F64)
    mids = (values[:-1] + values[1:]) / 2  # exact: few bits
    points = around(torch.cat([values, mids, past, torch.tensor(SPECIALS, dtype=F64)]))
    return torch.cat([signed(points), random_float64(100_000, seed)])


def torch_cast(x: torch.Tensor, name: str) -> torch.Tensor:
    return x.to(CODE_FORMATS[name].dtype).to(F64)


def test_the_formats_fields_give_their_values():
    for name, fmt in CODE_FORMATS.items():
        values = torch.unique(representable(name))
        want = values[values >= 0] if fmt.negatives else values
        assert torch.equal(grid(fmt), want), name
        assert (bool((values < 0).any()) == fmt.negatives and values.max().item() == fmt.max_value), name
        if fmt.torch_cast:
            codes = torch.arange(256, dtype=torch.uint8).view(fmt.dtype).to(F64)
            assert bool(torch.isinf(codes).any()) == fmt.infinities, name


def test_torch_casts_as_the_module_says():
    """The behaviours the module's docstring reports, measured on torch itself: a torch that changes them
    fails here first."""
    x = torch.tensor([480.0, 1e6, INF, -INF, -1e6, NAN], dtype=F64)
    saturating = torch.tensor([448, 448, 448, -448, -448, NAN], dtype=F64)  # torch 2.13 (pytorch#178817)
    got = torch_cast(x, "e4m3")
    assert same(got, saturating).all() or torch.isnan(got).all(), got  # or NaN throughout, as torch 2.11
    x = torch.tensor([61440.0, 61439.99, INF, -1e6], dtype=F64)
    assert same(torch_cast(x, "e5m2"), torch.tensor([INF, 57344, INF, -INF], dtype=F64)).all()
    k = torch.arange(-126, 127, dtype=F64)
    assert torch.equal(torch_cast(1.5 * 2**k, "e8m0"), 2 ** (k + 1))  # ties up
    below = torch.nextafter((1.5 * 2**k).float(), torch.zeros(len(k))).double()  # the float32 below the tie
    assert torch.equal(torch_cast(below, "e8m0"), 2**k)
    x = torch.tensor([-4.0, 0.0, -0.0, 2.0**-127, 1.25 * 2.0**-127, 1.75 * 2.0**127, INF, NAN], dtype=F64)
    want = torch.tensor([4, 2.0**-127, 2.0**-127, 2.0**-127, 2.0**-126, NAN, NAN, NAN], dtype=F64)
    assert same(torch_cast(x, "e8m0"), want).all()
    for name in ("e4m3", "e5m2"):
        got = torch_cast(torch.tensor([-0.0, -1e-30], dtype=F64), name)
        assert same(got, torch.tensor([-0.0, -0.0], dtype=F64)).all()
    # through float32: one float64 ulp above the midpoint 1.0625 rounds to it in float32, then ties to even
    assert torch_cast(torch.tensor([1.0625 + 2.0**-52], dtype=F64), "e4m3").item() == 1.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_fp8_round_to_is_torchs_cast(name, device):
    x = audit_points(name, seed=len(name)).to(device)
    assert_same(round_to(x, name, saturate=False), torch_cast(x, name), x)
    top = CODE_FORMATS[name].max_value
    assert_same(round_to(x, name), torch_cast(x.clamp(-top, top), name), x)


@pytest.mark.parametrize("device", DEVICES)
def test_e8m0_nearest_is_torchs_cast(device):
    x = audit_points("e8m0", seed=8).to(device)
    assert_same(round_to(x, "e8m0", saturate=False, rounding="nearest"), torch_cast(x, "e8m0"), x)
    assert_same(round_to(x, "e8m0", rounding="nearest"), torch_cast(x.clamp(-2.0**127, 2.0**127), "e8m0"), x)


def floor_log2(a: Fraction) -> int:
    k = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** k > a:
        k -= 1
    while Fraction(2) ** (k + 1) <= a:
        k += 1
    return k


def e8m0_directed(x: float, rounding: str, saturate: bool) -> float:
    if math.isnan(x):
        return NAN
    if math.isinf(x):
        return 2.0**127 if saturate else NAN
    a = Fraction(abs(x))
    k = -127 if a == 0 else floor_log2(a) + (rounding == "up" and Fraction(2) ** floor_log2(a) != a)
    return 2.0 ** max(k, -127) if k <= 127 else (2.0**127 if saturate else NAN)


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("rounding", ["up", "down"])
def test_e8m0_directed_roundings_are_exact(rounding, saturate):
    x = torch.cat([audit_points("e8m0")[:-100_000], random_float64(5_000, 3)])
    want = torch.tensor([e8m0_directed(v, rounding, saturate) for v in x.tolist()], dtype=F64)
    assert_same(round_to(x, "e8m0", saturate=saturate, rounding=rounding), want, x)


@pytest.mark.parametrize("device", DEVICES)
def test_int8_nearest_even_is_torch_round_then_clamp(device):
    x = torch.cat([audit_points("int8", seed=7), torch.arange(-300, 300, dtype=F64) / 4]).to(device)
    r = torch.round(x).clamp(-127, 127)
    want = torch.where(torch.isnan(r), r, r.to(torch.int8).to(F64))  # an integer has one zero
    assert_same(round_to(x, "int8"), want, x)
    x = torch.tensor([2.5, -0.5, 127.5, -128.0, -0.0], dtype=F64)
    assert same(round_to(x, "int8"), torch.tensor([2.0, 0.0, 127.0, -127.0, 0.0], dtype=F64)).all()


@pytest.mark.parametrize("device", DEVICES)
def test_int8_half_away_is_the_float32_idiom(device):
    x = torch.cat([audit_points("int8", seed=9), torch.arange(-300, 300, dtype=F64) / 4]).to(device)
    v = x.float()
    r = torch.trunc(v + 0.5 * torch.sign(v)).clamp(-127, 127).double()  # Triton's quantizers, in float32
    want = torch.where(torch.isnan(r), r, r.to(torch.int8).to(F64))
    assert_same(round_to(x, "int8", rounding="half_away"), want, x)
    below_half = 0.5 - 2.0**-25  # float32's sum with 0.5 rounds up to 1: so does the kernel
    x = torch.tensor([2.5, -2.5, 0.5, below_half, -below_half, 0.49999, 126.5], dtype=F64)
    want = torch.tensor([3.0, -3.0, 1.0, 1.0, -1.0, 0.0, 127.0], dtype=F64)
    assert same(round_to(x, "int8", rounding="half_away"), want).all()


def e2m1_nearest(v: float) -> float:
    """The e2m1 value nearest v by exact comparison, ties to the even code (+-6 past the largest)."""
    if math.isnan(v):
        return NAN
    if math.isinf(v):
        return math.copysign(6.0, v)
    a = Fraction(abs(v))
    code = min(range(8), key=lambda i: (abs(a - Fraction(E2M1[i])), i % 2))
    return math.copysign(E2M1[code], v)


def e2m1_reference(x: torch.Tensor) -> torch.Tensor:
    """e2m1_nearest of the float32 values of x (numpy rounds them), each distinct float32 (by its bits: the
    sign of zero kept) computed once."""
    with np.errstate(over="ignore", invalid="ignore"):
        bits = x.numpy().astype(np.float32).view(np.uint32)
    distinct, inverse = np.unique(bits, return_inverse=True)
    values = np.array([e2m1_nearest(float(v)) for v in distinct.view(np.float32)])
    return torch.from_numpy(values[inverse.reshape(-1)])


def test_e2m1_is_the_exact_nearest_code():
    x = audit_points("e2m1", seed=4)
    assert_same(round_to(x, "e2m1"), e2m1_reference(x), x)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, -0.1], dtype=F64)
    assert same(round_to(ties, "e2m1"), torch.tensor([0, 1, 1, 2, 2, 4, 4, -4, -0.0], dtype=F64)).all()


def scale_reference(amax: float, fmax: float, rule: str) -> float:
    if math.isnan(amax) or math.isinf(amax):
        return NAN
    if amax == 0:
        return 1.0
    a, f = Fraction(amax), Fraction(fmax)
    if rule == "ceil":
        k = floor_log2(a / f)
        k += Fraction(2) ** k < a / f  # smallest k with amax <= fmax * 2^k
    else:
        k = floor_log2(a) - floor_log2(f)
    return 2.0 ** min(max(k, -127), 127)


@pytest.mark.parametrize("rule", ["ceil", "ocp"])
@pytest.mark.parametrize("fmax", [448.0, 57344.0, 6.0, 127.0, 1.0, 0.75])
def test_pow2_scale_is_exact(fmax, rule):
    j = torch.arange(-160, 160, 3, dtype=F64)
    at = fmax * 2**j  # amax exactly a power of two times fmax
    tiny = torch.tensor([5e-324, 2.0**-1070 * 3, 2.0**-149, 1e-40, 2.0**-127, 2.0**-126 * 1.5, 0.0], dtype=F64)
    spread = random_float64(2_000, int(fmax)).abs()
    amax = torch.cat([around(torch.cat([at, tiny])).abs(), spread, torch.tensor([INF, NAN, 1e308], dtype=F64)])
    want = torch.tensor([scale_reference(a, fmax, rule) for a in amax.tolist()], dtype=F64)
    assert_same(pow2_scale(amax, fmax, rule=rule), want, amax)


def test_pow2_scale_rules_differ_where_the_top_codes_saturate():
    amax = torch.tensor([448.0, 449.0, 512.0, 0.0, 896.0], dtype=F64)
    assert pow2_scale(amax, 448.0, rule="ceil").tolist() == [1.0, 2.0, 2.0, 1.0, 2.0]
    assert pow2_scale(amax, 448.0, rule="ocp").tolist() == [1.0, 1.0, 2.0, 1.0, 2.0]


def test_to_codes_of_blocks():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float32) * 1e3
    x[2] = 0.0  # an all-zero block
    amax = x.double().abs().amax(-1, keepdim=True)
    scale = pow2_scale(amax, 448.0, rule="ceil")
    codes = to_codes(x.double(), scale, "e4m3")
    assert torch.equal(codes, (x / scale.float()).to(torch.float8_e4m3fn).to(F64))  # a float32 quantizer's
    assert codes.abs().max().item() <= 448.0 and torch.equal(codes[2], torch.zeros(32, dtype=F64))
    int8 = to_codes(x.double(), amax / 127, "int8")  # the zero block's scale is 0: no 0 / 0
    assert not bool(int8.isnan().any()) and torch.equal(int8[2], torch.zeros(32, dtype=F64))
    assert torch.equal(int8[:2], round_to(x[:2].double() / (amax[:2] / 127), "int8"))
    assert int8.abs().amax(-1).tolist() == [127.0, 127.0, 0.0, 127.0]
    x, scale = torch.tensor([[1.0, -2.0], [3.0, -0.0]], dtype=F64), torch.tensor([[0.0], [0.5]], dtype=F64)
    assert same(to_codes(x, scale, "e4m3"), torch.tensor([[0.0, 0.0], [6.0, -0.0]], dtype=F64)).all()


def test_refusals_name_the_argument():
    x = torch.zeros(3, dtype=F64)
    cases = [(lambda: code_format("e4m4"), "format", "e4m4"), (lambda: round_to(x, "fp8"), "fmt", "fp8"),
             (lambda: round_to(x.to(torch.int32), "e4m3"), "x", "int32"),
             (lambda: round_to(x, "e8m0"), "rounding", "nearest_even"),
             (lambda: round_to(x, "e4m3", rounding="half_away"), "rounding", "half_away"),
             (lambda: round_to(x, "int8", saturate=False), "saturate", "False"),
             (lambda: round_to(x, "e2m1", saturate=False), "saturate", "False"),
             (lambda: pow2_scale(x, 448.0, rule="floor"), "rule", "floor"),
             (lambda: pow2_scale(x, 0.0, rule="ceil"), "fmax", "0.0"),
             (lambda: pow2_scale(-x - 1, 448.0, rule="ceil"), "amax", "shape"),
             (lambda: to_codes(x, -x - 1, "e4m3"), "scale", "shape")]
    for call, argument, echoed in cases:
        with pytest.raises(InvalidArgument) as raised:
            call()
        assert raised.value.argument == argument and echoed in str(raised.value), str(raised.value)
    with pytest.raises(InvalidArgument) as raised:
        code_format("e4m4")
    assert all(name in str(raised.value) for name in CODE_FORMATS)
