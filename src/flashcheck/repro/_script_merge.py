"""A merge case's part of a reproducer (see :mod:`flashcheck.repro.script`): the states the merge got, its call
(a two-state merge folded pairwise, by flashcheck's own :func:`~flashcheck.judge.merge.fold_states`), and the exact
merge in float64 (flashcheck's own :func:`~flashcheck.numerics.merge.merge_reference`); the script gets both
functions' source. What comes after the line ``# ---- form ----`` is copied into the script in place of the
template's ``@FORM@`` line."""

import math

from ..judge.merge import fold_states
from ..numerics.merge import merge_reference
from ._script import CASE, check_byteorder, judge_output, tensor

# ---- form ----


def merge_inputs(device):
    """The states the merge got: outs (S, R, Dv) and lses (S, R) fp32, in the case's lse base."""
    check_byteorder()
    return {name: tensor(spec, device) for name, spec in CASE["inputs"].items()}, {}


def merge_run(fn, x, kw, device):
    outs, lses = x["outs"].clone(), x["lses"].clone()  # the merge may write in place
    if CASE["merge"]["convention"] == "pair":
        return fold_states(fn, outs, lses, CASE["merge"]["empty_lse"])
    return fn(outs, lses)


def merge_judge(result, x, kw, device):
    lses = x["lses"].double() * (math.log(2) if CASE["lse_base"] == "2" else 1.0)
    out, lse, empty = merge_reference(x["outs"], lses)
    return judge_output(result, (out, empty), (lse, empty), device)


INPUTS, RUN, JUDGE = merge_inputs, merge_run, merge_judge
