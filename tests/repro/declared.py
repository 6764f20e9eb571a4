"""The planted kernels under flashcheck's decorator, with a spec that declares a backward pass (a plain callable's
default spec has none): cases found on these name the functions underneath, which import no flashcheck."""

from planted_attention import fixed as _fixed
from planted_attention import wrong_dv as _wrong_dv

import flashcheck

wrong_dv = flashcheck.kernel(_wrong_dv, backward=True)
fixed = flashcheck.kernel(_fixed, backward=True)

from planted_sparse import sparse_fixed as _sparse_fixed
from planted_sparse import sparse_padding_as_key_0 as _sparse_padding_as_key_0

sparse_fixed = flashcheck.kernel(_sparse_fixed, key_sets=True, causal=("none", "bottom_right"))
sparse_padding_as_key_0 = flashcheck.kernel(_sparse_padding_as_key_0, key_sets=True, causal=("none", "bottom_right"))
