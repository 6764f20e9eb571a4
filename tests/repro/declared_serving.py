"""The planted serving kernels under flashcheck's decorator, with the spec of their form (a plain callable's default
spec is dense): cases found on these name the functions underneath, which import no flashcheck."""

import planted_serving as _planted

import flashcheck

_COMMON = dict(dtypes=("fp16", "bf16"), causal=("none", "bottom_right"), gqa=True, fully_masked_rows="zero",
               dv_equals_d=False)


def _declared(form: str, **spec):
    return lambda fn: flashcheck.kernel(fn, form=form, **_COMMON, **spec)


varlen_reads_past_end = _declared("varlen")(_planted.varlen_reads_past_end)
varlen_fixed = _declared("varlen")(_planted.varlen_fixed)
paged_page_off_by_one = _declared("paged")(_planted.paged_page_off_by_one)
paged_fixed = _declared("paged")(_planted.paged_fixed)
split_kv_empty_split_nan = _declared("paged", num_splits=(1, 3, 16))(_planted.split_kv_empty_split_nan)
split_kv_fixed = _declared("paged", num_splits=(1, 3, 16))(_planted.split_kv_fixed)

from flashcheck.contract.spec import Kernel as _Kernel
from flashcheck.kernels.registry import resolve_kernel as _resolve

_SPARSE = _resolve("torch:sparse-varlen", device="cpu")


def _sparse_varlen(*args, **keywords):  # a user's varlen kernel with index sets (flashcheck's reference underneath)
    return _SPARSE.fn(*args, **keywords)


sparse_varlen = _Kernel(_sparse_varlen, _SPARSE.spec, name="declared_serving:sparse_varlen")
