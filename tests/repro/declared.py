"""The planted kernels under flashcheck's decorator, with a spec that declares a backward pass (a plain callable's
default spec has none): cases found on these name the functions underneath, which import no flashcheck."""

from planted_attention import fixed as _fixed
from planted_attention import wrong_dv as _wrong_dv

import flashcheck

wrong_dv = flashcheck.kernel(_wrong_dv, backward=True)
fixed = flashcheck.kernel(_fixed, backward=True)
