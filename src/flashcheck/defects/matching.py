"""Naming a numerical bug: every defect model that applies runs on the bug's case, and a model *explains* the bug
when the kernel's output sits within the error budget of the model's output while the model itself breaks the
budget against the oracle, and the legal twin sits at least :data:`SEPARATION` times further from the kernel.

Costs stay off the case path: a campaign runs this once a distinct bug, on its smallest case, after shrinking
(:func:`explain`); ``replay`` and ``repro`` run it on the case they replay.

The fit of a model is taken over the elements that break the budget, the kernel's or the model's (out and lse,
or dQ, dK and dV): ``|kernel - model| / budget`` at each, the budget being the element's own against the oracle
(NaN against NaN and the same infinity agree; a non-finite value against a finite one is infinitely far). The
fit is the :data:`QUANTILE` of those: a defect that rounds in its own order (scores rounded to fp16, sums in
bf16) flips a rounding here and there where the kernel's order differs from the model's, and one flipped logit
moves a row far; the share of the elements within one budget is reported beside it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from ..contract.precision import precision_named
from ..contract.spec import as_kernel
from ..inputs.case import AttentionCase
from ..inputs.serving import ServingCase
from ..judge.backward import check_backward, is_backward_case, upstream_gradient
from ..judge.check import check
from ..judge.serving import group_budgets
from ..kernels.registry import resolve_kernel
from ..numerics.budget import Budget, contract_terms, error_budget
from ..numerics.gradient_budget import gradient_budget
from ..numerics.twin import Defect, Habits, Tiling, twin_attention
from .gradients import GradientDefect, contract_p_rounding, covers, model_gradients
from .library import BACKWARD_MODELS, FORWARD_MODELS, DefectModel, ModelCase, key_tiles

__all__ = ["Explanation", "Fit", "FIT_LIMIT", "QUANTILE", "SEPARATION", "explain", "explain_backward",
           "explain_forward"]

# A model explains a bug when the kernel sits within this many budgets of the model's output on this share of the
# elements that break the budget...
FIT_LIMIT = 1.0
QUANTILE = 0.9
# ... and the legal twin at least this many times further away.
SEPARATION = 2.0
# The largest case (score elements, B * Hq * Nq * Nk) the models run on: a shrunk case is far smaller.
MAX_SCORES = 1 << 22


@dataclass(frozen=True)
class Fit:
    """One model's fit to a bug: ``fit`` (the kernel against the model), ``model_ratio`` (the model against the
    oracle, its worst element) and ``twin_fit`` (the kernel against the legal twin), in error budgets; ``within``:
    the share of the broken elements where the kernel sits within one budget of the model; ``bitwise``: the kernel
    gave the model's every bit; ``tile``: the key tile the model ran with (forward models)."""

    model: str
    param: str | None
    says: str
    fit: float
    model_ratio: float
    twin_fit: float
    within: float = 0.0
    bitwise: bool = False
    tile: int | None = None

    @property
    def explains(self) -> bool:
        return (self.fit <= FIT_LIMIT and self.model_ratio > 1.0
                and (self.twin_fit >= SEPARATION * self.fit or self.bitwise))

    @property
    def name(self) -> str:
        """``model(param)``, or the model's name alone."""
        return f"{self.model}({self.param})" if self.param else self.model

    def line(self, kernel_ratio: float | None = None) -> str:
        if self.bitwise:
            against = "bitwise"
        else:
            against = (f"err/budget {_num(self.fit)} against the model on {QUANTILE:.0%} of the broken elements, "
                       f"{self.within:.0%} within one budget")
        oracle = "" if kernel_ratio is None else f", {_num(kernel_ratio)} against the oracle"
        tiles = "" if self.tile is None else f"; key tiles of {self.tile}"
        return (f"matches {self.name}: the kernel {self.says} ({against}{oracle}; the legal twin "
                f"{_num(self.twin_fit)}{tiles})")


@dataclass
class Explanation:
    """The models that explain a bug, best fit first; ``tried``: how many model runs were compared; ``note``: why
    no model ran, where none did."""

    fits: list[Fit] = field(default_factory=list)
    tried: int = 0
    kernel_ratio: float | None = None
    note: str | None = None

    @property
    def best(self) -> Fit | None:
        return self.fits[0] if self.fits else None

    @property
    def named(self) -> str | None:
        """The best fit's model and parameter, ``scores_rounded(bf16)``; None when no model explains the bug."""
        return None if self.best is None else self.best.name

    def line(self) -> str:
        if self.note:
            return f"defect models: {self.note}"
        if not self.fits:
            return f"defect models: none of {self.tried} matches (no known mistake gives this output)"
        first = self.fits[0].line(self.kernel_ratio)
        others = "; ".join(f"{f.name} {_num(f.fit)}" for f in self.fits[1:4])
        return first + (f"; also within the budget: {others}" if others else "")

    def as_dict(self) -> dict:
        return {"named": self.named, "line": self.line(), "tried": self.tried, "note": self.note,
                "kernel_ratio": _json(self.kernel_ratio),
                "fits": [{**asdict(f), **{k: _json(getattr(f, k)) for k in _FLOATS}} for f in self.fits]}

    @classmethod
    def from_dict(cls, d: dict) -> "Explanation":
        fits = [Fit(**{**f, **{k: _unjson(f[k]) for k in _FLOATS}}) for f in d.get("fits") or []]
        return cls(fits, d.get("tried", 0), _unjson(d.get("kernel_ratio")), d.get("note"))


_FLOATS = ("fit", "model_ratio", "twin_fit")


def _num(x: float) -> str:
    if x is None or not math.isfinite(x):
        return str(x)
    return f"{x:,.0f}" if x >= 1000 else f"{x:.3g}"


def _json(x):
    return None if x is None else (x if math.isfinite(x) else str(x))


def _unjson(x):
    return None if x is None else float(x)


# ---- distances ------------------------------------------------------------------------------------------------

def ratios(got: torch.Tensor, want: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """|got - want| / budget element by element, float64: 0 where they agree (NaN and NaN, the same infinity, equal
    values), inf where one is finite and the other not."""
    got, want = got.detach().double(), want.detach().double().to(got.device)
    agree = (torch.isnan(got) & torch.isnan(want)) | (got == want)
    finite = torch.isfinite(got) & torch.isfinite(want)
    return torch.where(agree, 0.0, torch.where(finite, (got - want).abs() / budget.to(got.device), math.inf))


@dataclass
class _Compared:
    """The kernel's tensors beside the oracle's, each with the budget of its elements (rows with no visible key:
    the exact answer a careful kernel gives, 0 or -inf, within a stand-in budget of the output's rounding)."""

    got: dict  # name -> the kernel's tensor, float64
    exact: dict  # name -> the oracle's
    budget: dict  # name -> the budget, positive everywhere

    def __post_init__(self):
        self.broken = {n: ratios(self.got[n], self.exact[n], self.budget[n]) > 1 for n in self.got}

    def stats(self, model: dict) -> tuple[float, float, float, bool]:
        """(fit, within, the model's worst ratio against the oracle, bitwise) of a model's tensors."""
        gaps, worst, bitwise = [], 0.0, True
        for n in self.got:
            against_oracle = ratios(model[n], self.exact[n], self.budget[n])
            worst = max(worst, float(against_oracle.max()) if against_oracle.numel() else 0.0)
            gap = ratios(self.got[n], model[n], self.budget[n])
            bitwise = bitwise and bool((gap == 0).all())
            gaps.append(gap[self.broken[n] | (against_oracle > 1)])
        gaps = torch.cat(gaps)
        if not gaps.numel():
            return 0.0, 1.0, worst, bitwise
        ordered = gaps.sort().values
        fit = float(ordered[min(len(ordered) - 1, math.ceil(QUANTILE * len(ordered)) - 1)])
        return fit, float((gaps <= FIT_LIMIT).double().mean()), worst, bitwise


def _filled(exact, budget, empty, floor, fill: float):
    """The oracle's tensor and budget with the rows it leaves empty filled: ``fill`` within ``floor``."""
    empty = empty.to(exact.device)
    exact = torch.where(empty, fill, exact)
    budget = torch.where(empty | ~torch.isfinite(budget) | (budget <= 0), floor, budget)
    return exact, budget


def _fit(model: DefectModel, param, compared: _Compared, got: dict, twin_fit: float, tile=None) -> Fit:
    fit, within, worst, bitwise = compared.stats(got)
    return Fit(model.name, _param_text(param), model.describe(param), fit, worst, twin_fit, within, bitwise, tile)


def _rank(fits: list[Fit], tried: int, kernel_ratio: float) -> Explanation:
    named = sorted((f for f in fits if f.explains), key=lambda f: (not f.bitwise, f.fit))
    best: dict = {}
    for f in named:  # one line a model: its best parameter and tile
        best.setdefault(f.model, f)
    return Explanation(list(best.values()), tried, kernel_ratio)


def _model_case(case: AttentionCase, contract, *, backward: bool) -> ModelCase:
    s = case.shapes
    terms = contract_terms(contract, case.torch_dtype)
    p_format = {2.0**-24: "fp32", 2.0**-11: "fp16", 2.0**-8: "bf16"}.get(terms.u_p, "tf32" if terms.u_p else "fp32")
    return ModelCase(case.dtype, p_format, case.scale, s.head_dim, s.n_k, backward=backward,
                     grouped=s.heads_q != s.heads_kv)


def _runs(models: tuple[DefectModel, ...], mc: ModelCase):
    for model in models:
        for param in model.params:
            if model.applies(param, mc):
                yield model, param


def _too_large(case: AttentionCase) -> str | None:
    s = case.shapes
    scores = s.batch * s.heads_q * s.n_q * s.n_k
    if scores > MAX_SCORES:
        return f"not run: the case has {scores:,} scores, past the {MAX_SCORES:,} the models run on (shrink it first)"
    if case.variant is not None and case.variant.quantized:
        return "not run: the models describe 16- and 32-bit inputs, not quantized ones"
    return None


# ---- the forward ----------------------------------------------------------------------------------------------

def explain_forward(case: AttentionCase, out: torch.Tensor, lse: torch.Tensor | None, budget: Budget, *,
                    device) -> Explanation:
    """The models that explain ``out`` (and ``lse``, natural log) on ``case`` judged with ``budget``."""
    ref = budget.reference
    compared = _forward_compared(out, lse, budget)
    kernel_ratio = max(float(ratios(compared.got[n], compared.exact[n], compared.budget[n]).max())
                       for n in compared.got)
    note = _too_large(case) or ("not run: the oracle judged a sample of the rows" if ref.rows is not None else None)
    if note:
        return Explanation(kernel_ratio=kernel_ratio, note=note)
    mc = _model_case(case, budget.precision, backward=False)
    fits, tried = [], 0
    for tile in key_tiles(case.shapes.n_k):
        twin_fit = compared.stats(_twin_forward(case, budget, Defect(), tile, device))[0]
        for model, param in _runs(FORWARD_MODELS, mc):
            tried += 1
            got = _twin_forward(case, budget, model.build(param, mc), tile, device)
            fits.append(_fit(model, param, compared, got, twin_fit, tile))
    return _rank(fits, tried, kernel_ratio)


def _forward_compared(out, lse, budget: Budget) -> _Compared:
    ref, terms = budget.reference, budget.contract
    v_size = float(ref.inputs["v"].abs().max()) if ref.inputs is not None else 1.0
    # Rows with no visible key have no budget: an output there agrees within the output's rounding.
    floor = terms.u_o * 4 * max(v_size, 1e-30) + terms.s_o
    empty = ref.empty_rows
    tensors = {"out": (out, *_filled(ref.out, budget.total, empty[..., None], floor, 0.0))}
    if lse is not None:
        tensors["lse"] = (lse, *_filled(ref.lse, budget.lse_total, empty, 2.0**-20, -math.inf))
    return _Compared({n: t[0].detach().double().to(ref.out.device) for n, t in tensors.items()},
                     {n: t[1] for n, t in tensors.items()}, {n: t[2] for n, t in tensors.items()})


def _twin_forward(case: AttentionCase, budget: Budget, defect: Defect, tile: int, device) -> dict:
    q, k, v = (t.to(device) for t in (case.q, case.k, case.v))
    mask = None if case.attn_mask is None else case.attn_mask.to(device)
    out, lse = twin_attention(q, k, v, scale=case.scale, causal=case.causal, attn_mask=mask,
                              precision=budget.precision, variant=case.variant, tiling=Tiling(64, tile),
                              habits=Habits(defect=defect))
    return {"out": out, "lse": lse}


def _param_text(param) -> str | None:
    if param is None:
        return None
    if isinstance(param, tuple):
        return ",".join(str(p) for p in param)
    return f"{param:g}" if isinstance(param, float) else str(param)


# ---- the backward ---------------------------------------------------------------------------------------------

def explain_backward(case: AttentionCase, grads: tuple, budget, do: torch.Tensor, *, device) -> Explanation:
    """The backward models that explain ``grads`` (dQ, dK, dV) on ``case`` for ``do``, judged with the gradient
    ``budget``."""
    names = ("dq", "dk", "dv")
    got = {n: g.detach().double() for n, g in zip(names, grads) if isinstance(g, torch.Tensor)}
    if not got:
        return Explanation(note="not run: the kernel returned no gradient")
    tiny = torch.finfo(torch.float64).tiny
    compared = _Compared(got, {n: budget.gradients[n] for n in got},
                         {n: budget.total[n].clamp_min(tiny) for n in got})
    kernel_ratio = max(float(ratios(got[n], compared.exact[n], compared.budget[n]).max()) for n in got)
    note = _too_large(case) or (None if covers(case) else
                                "not run: the backward's models describe cases without a bias, cap or sink")
    if note:
        return Explanation(kernel_ratio=kernel_ratio, note=note)
    precision = precision_named(budget.precision)
    p_rounding = contract_p_rounding(precision, case.torch_dtype)
    mc = _model_case(case, precision, backward=True)

    def run(defect):
        return dict(zip(names, model_gradients(case, do, p_rounding=p_rounding, defect=defect, device=device)))

    twin_fit = compared.stats(run(GradientDefect()))[0]
    fits, tried = [], 0
    for model, param in _runs(BACKWARD_MODELS, mc):
        tried += 1
        fits.append(_fit(model, param, compared, run(model.build(param, mc)), twin_fit))
    return _rank(fits, tried, kernel_ratio)


# ---- a kernel on a case ---------------------------------------------------------------------------------------

def explain(kernel, case, *, device=None, verdict=None, do=None) -> Explanation:
    """Run ``kernel`` on ``case`` (or take ``verdict``'s output of that run) and match its output against the
    library: the backward's gradients for a backward case or with an upstream gradient ``do``, else the forward's
    output. A serving case is matched group by group (each group's logical problem as a dense case); the groups'
    explanations are joined by model, a model explaining the bug where it explains every group that broke."""

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    kern = _kernel(kernel, device)
    if isinstance(case, ServingCase):
        return _explain_serving(kern, case, device, verdict)
    if _too_large(case):
        return Explanation(note=_too_large(case))
    if kern.spec.quantization.quantizer:
        return Explanation(note="not run: the models describe 16- and 32-bit arithmetic, not a kernel that "
                                "quantizes its inputs")
    exact = tuple(t.to(device) for t in (case.q, case.k, case.v))
    mask = None if case.attn_mask is None else case.attn_mask.to(device)
    kw = dict(scale=case.scale, causal=case.causal, attn_mask=mask, variant=case.variant)
    if do is not None or is_backward_case(case):
        do = upstream_gradient(case, device) if do is None else do.to(device)
        verdict = verdict or check_backward(kern, case, device=device, do=do)
        if not isinstance(verdict.output, tuple):
            return Explanation(note="not run: the kernel gave no gradients (a crash or a skip)")
        budget = gradient_budget(*exact, do, **kw, precision=kern.spec.precision)
        return explain_backward(case, verdict.output, budget, do, device=device)
    budget = error_budget(*exact, **kw, precision=kern.spec.precision)
    verdict = verdict or check(kern, case, device=device, budget=budget, properties=(), envelope=False)
    if not isinstance(verdict.output, tuple) or verdict.output[0] is None:
        return Explanation(note="not run: the kernel gave no output (a crash or a skip)")
    out, lse = verdict.output
    return explain_forward(case, out, _natural(lse, kern), budget, device=device)


def _kernel(kernel, device):
    return resolve_kernel(kernel, device=device.type) if isinstance(kernel, str) else as_kernel(kernel)


def _natural(lse, kern):
    """A kernel's lse in natural log, as the oracle's."""
    if lse is None:
        return None
    return lse.detach().double() * (math.log(2) if kern.spec.lse_base == "2" else 1.0)


def _explain_serving(kern, case: ServingCase, device, verdict) -> Explanation:

    verdict = verdict or check(kern, case, device=device, properties=())
    if not isinstance(verdict.output, tuple) or verdict.output[0] is None:
        return Explanation(note="not run: the kernel gave no output (a crash or a skip)")
    out, lse = verdict.output
    parts = []
    for group, budget in zip(case.groups, group_budgets(case, kern.spec.precision, device)):
        g_out = case.unpack(out, group)
        g_lse = None if lse is None else _natural(case.unpack(lse, group, lse=True), kern)
        explained = explain_forward(group.case, g_out, g_lse, budget, device=device)
        if (explained.kernel_ratio or 0.0) > 1.0:
            parts.append(explained)
    return _joined(parts)


def _joined(parts: list[Explanation]) -> Explanation:
    """The explanations of a case's broken groups as one: a model named where it explains each of them, its worst
    fit; the notes, tries and ratios carried over."""
    if not parts:
        return Explanation(note="not run: no sequence group broke its budget")
    notes = [p.note for p in parts if p.note]
    if notes:
        return Explanation(kernel_ratio=max(p.kernel_ratio or 0 for p in parts), note=notes[0])
    common = set.intersection(*({f.model for f in p.fits} for p in parts))
    fits = [max((f for p in parts for f in p.fits if f.model == name), key=lambda f: f.fit) for name in common]
    return Explanation(sorted(fits, key=lambda f: (not f.bitwise, f.fit)), sum(p.tried for p in parts),
                       max(p.kernel_ratio or 0 for p in parts))
