"""Quantization schemes: how a kernel's quantized inputs are scaled, as records a spec names.

A quantized input's value is its code times its scales. Every scheme keeps FA3's per-(batch entry, K/V head)
fp32 descale of q, k and v (:mod:`flashcheck.inputs.quantization`; 1 where a scheme has none) and may add
**block scales**: one scale per ``size`` consecutive values along the tokens or the head dims of a tensor, in
a scale format of its own (fp32, e8m0, e4m3). A value is then ``code * block_scale * descale``, exact in
float64 (4 significand bits, times at most 24, times 24).

A scheme also says how a kernel may requantize P before P @ V: the least factor it multiplies P by before
P's fp8 rounding (:attr:`Scheme.p_scale`), which sets the absolute error of P's smallest values; a larger
factor is more accurate and any factor that leaves P's largest value within the format's range is legal.
Where a scheme's kernels compute on dequantized values (:attr:`Scheme.compute`, a KV cache's), they may round
q, k, v and P to that format instead.

A scheme may narrow the codes' value format (:attr:`Scheme.codes`: NVFP4's e2m1, carried in fp8_e4m3, which holds
each of its values exactly) and give each tensor a second-level scale, one fp32 for the whole tensor
(:attr:`Scheme.global_scale`), in place of the per-head descales.

A scheme whose codes are held in its compute format (:attr:`Scheme.held_codes`, FlashMLA's fp8 latent cache) takes
inputs of that format: a tensor of :attr:`Scheme.quantized` holds codes there (past a block's ``span``, plain values),
the others are not quantized, and the kernel forms each value in the compute format, its block scale rounded to it
first. The compute format may be the inputs' own (:data:`INPUT`: fp16 or bf16, an fp8 KV cache beside q in
FlashInfer's and vLLM's convention), and a tensor's one scale may be a global scale alone, with no block scales
(:attr:`Scheme.tensor_scales`: FlashInfer's ``k_scale`` and ``v_scale``).

Read without torch (the CLI lists the schemes); the kernels' keyword for each tensor's block scales is
``{q,k,v}_block_scales``, in the torch dtype of the scale format (:mod:`flashcheck.features.quantized`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import InvalidArgument
from .formats import QUANTIZED_DTYPES, is_quantized

__all__ = ["Blocks", "Scheme", "SCHEMES", "QUANTIZERS", "SCALE_FORMATS", "CODES", "CODE_CARRIER", "AXES", "INPUT",
           "check_spec", "scheme_named"]

AXES = ("tokens", "dims", "columns")
_HALF_FORMATS = ("fp16", "bf16")  # the formats a kernel may round P or P @ V's partial sums to
# A compute format that is the inputs' own (fp16 or bf16): FlashInfer casts an fp8 KV cache to q's dtype.
INPUT = "input"
# A scale format's torch dtype and its largest value; each of its values is exact in fp32, where cases keep them.
SCALE_FORMATS = {"fp32": "float32", "e8m0": "float8_e8m0fnu", "e4m3": "float8_e4m3fn"}
# Code formats narrower than fp8, carried in fp8_e4m3 (torch has no arithmetic on float4_e2m1fn_x2): their
# nonnegative values (OCP MX fp4; the negatives too).
CODES = {"e2m1": (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)}
CODE_CARRIER = "fp8_e4m3"


def _check_choice(argument: str, value, allowed: tuple):
    if value not in allowed:
        raise InvalidArgument(argument, value, "unknown value", f"Choose from {list(allowed)}.")


@dataclass(frozen=True)
class Blocks:
    """One tensor's block scales: one per block of ``size`` along ``axis`` (the last block may be shorter), in
    ``format``. Of a tensor (B, H, N, D): ``"tokens"``, one per block of tokens and head, all dims of them
    ((B, H, ceil(N / size)), a KV cache's page); ``"dims"``, one per block of a token's dims ((B, H, N,
    ceil(D / size)), the contracted axis of Q K^T); ``"columns"``, one per block of tokens in each dim ((B, H,
    ceil(N / size), D), the contracted axis of P V). ``span`` (axis ``"dims"`` only): only a token's first ``span``
    dims carry scales, the rest stay unquantized (MLA's rope dims beside its latent)."""

    size: int
    axis: str = "tokens"
    format: str = "fp32"
    span: int | None = None

    def __post_init__(self):
        if not (isinstance(self.size, int) and not isinstance(self.size, bool) and 1 <= self.size <= 4096):
            raise InvalidArgument("size", self.size, "a block holds 1 to 4,096 values",
                                  "Pass Blocks(size=...) as a positive integer, e.g. 32.")
        _check_choice("axis", self.axis, AXES)
        _check_choice("format", self.format, tuple(SCALE_FORMATS))
        if self.span is not None and not (isinstance(self.span, int) and not isinstance(self.span, bool)
                                          and self.span >= 1 and self.axis == "dims"):
            raise InvalidArgument("span", self.span, f"a positive count of a token's first dims (axis={self.axis!r})",
                                  "Pass span with axis='dims' (e.g. Blocks(128, 'dims', span=512)), or leave it out.")

    def count(self, length: int) -> int:
        """How many blocks cover ``length`` values."""
        return -(-length // self.size)

    def coded(self, dims: int) -> int:
        """How many of a token's ``dims`` carry scales: the first ``span``, or all."""
        return dims if self.span is None else min(dims, self.span)

    def text(self) -> str:
        what = {"tokens": "tokens", "dims": "dims of a token", "columns": "tokens of a dim"}[self.axis]
        return f"{self.format} per {self.size} {what}" + (f" (its first {self.span})" if self.span else "")


@dataclass(frozen=True)
class Scheme:
    """A quantization scheme: the block scales of q, k and v (None: a tensor has its descale only), whether
    the kernel receives the per-head descales as well, the least factor P is scaled by before its rounding,
    the format a kernel may compute in on dequantized values, and whose convention it is."""

    name: str
    q: Blocks | None = None
    k: Blocks | None = None
    v: Blocks | None = None
    descales: bool = True
    p_scale: float = 1.0
    compute: str | None = None  # the format dequantized values and P may be rounded to (None: P to the codes')
    convention: str = ""
    # A kernel that quantizes its own fp16, bf16 or fp32 inputs: the quantizer's name (:data:`QUANTIZERS`), whose
    # exact emulation the oracle attends; P's format before P @ V; P @ V summed in a format over runs of keys.
    quantizer: str | None = None
    p_format: str | None = None
    pv_sums: tuple | None = None  # (format, keys per run)
    # NVFP4: the codes' value format where narrower than the inputs' fp8 (:data:`CODES`), and one fp32 scale per
    # tensor, passed as ``{q,k,v}_global_scale`` (0-dim) and held as the case's descales, equal over (B, Hkv).
    codes: str | None = None
    global_scale: bool = False
    # The codes' format where the inputs are in the compute format and hold them (see the module's docstring), and
    # the tensors that hold codes (the others, with held codes only, keep their values: FlashInfer's q).
    held_codes: str | None = None
    quantized: str = "qkv"

    def __post_init__(self):
        if self.compute is not None:
            _check_choice("compute", self.compute, _HALF_FORMATS + (INPUT,))
        if self.codes is not None:
            _check_choice("codes", self.codes, tuple(CODES))
        if self.global_scale and self.descales:
            raise InvalidArgument("global_scale", self.global_scale, "a global scale per tensor replaces the per-head "
                                  "descales", "Pass descales=False with global_scale=True.")
        if self.quantizer is not None:
            _check_choice("quantizer", self.quantizer, tuple(QUANTIZERS))
        if self.p_format is not None:
            _check_choice("p_format", self.p_format, _HALF_FORMATS)
        if self.pv_sums is not None:
            sums = tuple(self.pv_sums)
            if len(sums) != 2 or sums[0] not in _HALF_FORMATS or not (isinstance(sums[1], int) and sums[1] >= 1):
                raise InvalidArgument("pv_sums", self.pv_sums, "expected (format, keys per run)",
                                      f"Pass e.g. ('fp16', 64): a format of {list(_HALF_FORMATS)} and a positive count.")
            object.__setattr__(self, "pv_sums", sums)
        self._check_codes()
        self._check_quantized()

    def _check_codes(self):
        spans = [b.span for b in self.blocks if b is not None and b.span is not None]
        if self.held_codes is None and spans:
            raise InvalidArgument("span", spans[0], "dims left unquantized need inputs in the compute format",
                                  "Declare held_codes='fp8_e4m3' and compute='bf16' with a span, or leave the span out.")
        if self.held_codes is None:
            return
        _check_choice("held_codes", self.held_codes, QUANTIZED_DTYPES)
        if self.compute is None or self.descales:
            raise InvalidArgument("held_codes", self.held_codes, "codes held in the inputs need a compute format to "
                                  f"hold them and no descales (compute={self.compute!r}, descales={self.descales})",
                                  "Declare compute='bf16' and descales=False with held_codes.")

    def _check_quantized(self):
        fix = "Name the tensors that hold codes in order, e.g. quantized='kv', each with its scales."
        if not self.quantized or self.quantized not in ("qkv", "qk", "qv", "kv", "q", "k", "v"):
            raise InvalidArgument("quantized", self.quantized, "expected some of 'qkv', in order", fix)
        if self.quantized != "qkv" and self.held_codes is None:
            raise InvalidArgument("quantized", self.quantized, "only inputs in the compute format can leave a tensor "
                                  "unquantized", "Declare held_codes and compute with quantized, or leave it out.")
        plain = [t for t, b in zip("qkv", self.blocks) if b is not None and t not in self.quantized]
        if plain:
            raise InvalidArgument("quantized", self.quantized, f"{plain[0]} has block scales but holds no codes", fix)
        if self.held_codes and not self.block_scaled and not self.global_scale:
            raise InvalidArgument("held_codes", self.held_codes, "held codes need a scale: block scales or a global "
                                  "scale per tensor", "Give the quantized tensors Blocks(...), or pass global_scale=True.")

    def holds_codes(self, dtype: str) -> bool:
        """Whether a case of ``dtype`` (a name) carries this scheme's scales: an fp8 dtype, or the compute format
        where the scheme's codes are held in it."""
        return is_quantized(dtype) if self.held_codes is None else dtype == self.compute_format(dtype)

    def compute_format(self, dtype: str) -> str | None:
        """The compute format of a case of ``dtype`` (a name): the inputs' own where it is :data:`INPUT` (fp16 or
        bf16 only)."""
        if self.compute != INPUT:
            return self.compute
        return dtype if dtype in _HALF_FORMATS else None

    @property
    def tensor_scales(self) -> bool:
        """Whether each quantized tensor's one scale is its global scale (no block scales): FlashInfer's and vLLM's
        ``k_scale`` and ``v_scale``, which a kernel may fold into the softmax scale and into its rounded output."""
        return self.global_scale and not self.block_scaled

    @property
    def blocks(self) -> tuple:
        return (self.q, self.k, self.v)

    @property
    def block_scaled(self) -> bool:
        return any(b is not None for b in self.blocks)

    def as_dict(self):
        """Its name where it is one of :data:`SCHEMES` (a spec's JSON), else its fields."""
        if SCHEMES.get(self.name) == self:
            return self.name
        return dataclasses.asdict(self)

    def text(self) -> str:
        if self.quantizer:
            return f"{self.name}: {QUANTIZERS[self.quantizer]}"
        parts = [f"{self.codes} codes"] if self.codes else []
        parts += [f"{t} {b.text()}" for t, b in zip("qkv", self.blocks) if b is not None]
        return f"{self.name}: " + ("; ".join(parts) or "descales per batch entry and K/V head") + (
            f"; P scaled by at least {self.p_scale:g}" if self.p_scale != 1 else "") + (
            f"; {self.held_codes} codes in {_compute_text(self.compute)} inputs ({self.quantized} only)"
            if self.held_codes else "") + ("; an fp32 global scale per tensor" if self.global_scale else "")


def _compute_text(compute: str) -> str:
    return "fp16 or bf16" if compute == INPUT else compute


# The quantizers a kernel may apply inside, each emulated exactly by the oracle (numerics/quantized_inside.py).
QUANTIZERS = {
    "sage_int8": "int8 codes of q (sm_scale x 1.44269504 folded in, fp32) per 128 tokens and of k minus its mean "
                 "over the tokens (in the input dtype) per 64 tokens, each with an fp32 scale amax / 127, rounded "
                 "half away from zero; v cast to fp16",
    "sage_int8_packed": "sage_int8's codes per 128 and 64 tokens of each packed sequence, k less its mean over every "
                        "packed token of the batch (all sequences together)",
}

SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme("per_head", convention="FA3: q, k and v each with one fp32 descale per batch entry and K/V head"),
    # KV caches: a scale per token and K/V head (vLLM's per-token-head cache) or per block of tokens (a page).
    Scheme("per_token_kv", k=Blocks(1), v=Blocks(1), compute="bf16",
           convention="an fp8 KV cache with an fp32 scale per token and K/V head (vLLM's per-token-head scales)"),
    Scheme("per_block_kv", k=Blocks(16), v=Blocks(16), compute="bf16",
           convention="an fp8 KV cache with an fp32 scale per block of 16 tokens and K/V head (a page's)"),
    # MXFP8 (OCP microscaling): an e8m0 scale per 32 values along each product's contracted axis; P too, so its
    # block scale may grow P's codes up to the format's largest value: P's least factor is 2^8 (the smallest
    # power of two whose multiple of 1 stays within 448).
    Scheme("mxfp8", q=Blocks(32, "dims", "e8m0"), k=Blocks(32, "dims", "e8m0"), v=Blocks(32, "columns", "e8m0"),
           descales=False, p_scale=256.0, convention="MXFP8: e4m3 codes with an e8m0 scale per 32 values along the contracted "
                                      "axis (q and k along the head dims, v along the tokens)"),
    # NVFP4: e2m1 codes with an e4m3 scale per 16 values along the contracted axis and an fp32 global scale per
    # tensor; P is not requantized: it stays in bf16, the compute format.
    Scheme("nvfp4", q=Blocks(16, "dims", "e4m3"), k=Blocks(16, "dims", "e4m3"), v=Blocks(16, "columns", "e4m3"),
           descales=False, global_scale=True, codes="e2m1", compute="bf16",
           convention="NVFP4: e2m1 codes with an e4m3 scale per 16 values along the contracted axis (q and k along "
                      "the head dims, v along the tokens) and an fp32 global scale per tensor"),
    # SageAttention 1.0.6: int8 Q K^T quantized inside the kernel; P in fp16, P @ V summed in fp16 per tile of 64
    # keys (an fp16 accumulator per tile), the tiles' sums in fp32.
    Scheme("sage_int8", q=Blocks(128), k=Blocks(64), descales=False, quantizer="sage_int8", p_format="fp16",
           pv_sums=("fp16", 64), convention="SageAttention 1.0.6: fp16, bf16 or fp32 inputs quantized inside: "
                                            + QUANTIZERS["sage_int8"]),
    # Its varlen call: the same arithmetic per sequence, but k's mean is taken over the whole packed batch.
    Scheme("sage_int8_packed", q=Blocks(128), k=Blocks(64), descales=False, quantizer="sage_int8_packed",
           p_format="fp16", pv_sums=("fp16", 64),
           convention="SageAttention 1.0.6 on packed sequences: fp16, bf16 or fp32 inputs quantized inside: "
                      + QUANTIZERS["sage_int8_packed"]),
    # FlashMLA's fp8 latent cache (DeepSeek V3.2): K's 512 latent dims (V's too) as e4m3 codes with an fp32 scale per
    # 128, its 64 rope dims in bf16, q in bf16.
    Scheme("flashmla_fp8", k=Blocks(128, "dims", span=512), v=Blocks(128, "dims", span=512), descales=False,
           compute="bf16", held_codes="fp8_e4m3", quantized="kv",
           convention="FlashMLA's fp8 latent cache: per token 512 e4m3 codes, 4 fp32 scales (one per 128 codes), "
                      "64 bf16 rope values; q in bf16"),
    # FlashInfer's and vLLM's fp8 KV cache: q fp16 or bf16, not quantized; k and v fp8 codes with one fp32 scale per
    # tensor (k_scale, v_scale), held in q's dtype (FlashInfer casts the codes to it before its dots).
    *(Scheme(name, descales=False, global_scale=True, compute=INPUT, held_codes=codes, quantized="kv",
             convention=f"FlashInfer's and vLLM's fp8 KV cache: k and v {codes[4:]} codes with one fp32 scale per "
                        "tensor (k_scale, v_scale); q fp16 or bf16, not quantized")
      for name, codes in (("per_tensor_kv", "fp8_e4m3"), ("per_tensor_kv_e5m2", "fp8_e5m2"))),
)}


def check_spec(scheme: Scheme, *, dtypes: tuple, latent: int | None) -> None:
    """An :class:`InvalidArgument` where a spec cannot carry ``scheme``: narrower codes come in their carrier
    (fp8_e4m3) alone, codes held in the compute format in that dtype alone; a span scales the latent of a cached row (``latent``: its width, None without one), shared by K and
    V."""
    if scheme.codes and any(d in QUANTIZED_DTYPES and d != CODE_CARRIER for d in dtypes):
        raise InvalidArgument("dtypes", dtypes, f"the scheme {scheme.name} carries its {scheme.codes} codes in "
                              f"{CODE_CARRIER}", f"Declare dtypes=({CODE_CARRIER!r},).")
    held_in = _HALF_FORMATS if scheme.compute == INPUT else (scheme.compute,)
    if scheme.held_codes is not None and not (dtypes and set(dtypes) <= set(held_in)):
        raise InvalidArgument("dtypes", list(dtypes), f"quantization={scheme.name!r} hands the kernel "
                              f"{_compute_text(scheme.compute)} inputs that hold {scheme.held_codes} codes",
                              f"Declare dtypes={held_in!r} (or one of them) with this scheme.")
    spans = {b.span for b in scheme.blocks if b is not None and b.span is not None}
    if spans and (spans != {latent} or scheme.k != scheme.v):
        raise InvalidArgument("quantization", scheme.name, f"scales a token's first {min(spans)} dims, the latent of "
                              f"a cached row that K and V share, but the spec's row has {latent} latent dims",
                              "Declare the spec's cached row with a latent as wide as the span, and the same Blocks "
                              "for k and v.")


def scheme_named(value: object, *, argument: str = "quantization") -> Scheme:
    """The scheme of a name or of :meth:`Scheme.as_dict`'s fields (a :class:`Scheme` passes through)."""
    if isinstance(value, Scheme):
        return value
    if isinstance(value, str) and value in SCHEMES:
        return SCHEMES[value]
    if isinstance(value, dict) and set(value) <= {f.name for f in dataclasses.fields(Scheme)} and "name" in value:
        blocks = {t: Blocks(**value[t]) for t in "qkv" if isinstance(value.get(t), dict)}
        return Scheme(**{**value, **blocks})
    raise InvalidArgument(argument, value, "unknown quantization scheme",
                          f"Use one of {list(SCHEMES)} or a flashcheck.contract.quantization.Scheme(...).")
