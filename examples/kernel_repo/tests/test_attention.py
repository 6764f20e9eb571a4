"""tinyflash's attention tested with flashcheck, as a kernel repository would."""

import os

import pytest
from hypothesis import given, settings

import flashcheck
from flashcheck.strategies import cases
from tinyflash import attention

# The Triton interpreter computes tl.dot on bf16 operands on their raw bits (flashcheck reports it as a
# BUG): under the interpreter (--flashcheck-device cpu sets TRITON_INTERPRET=1) test fp16 and fp32 only.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DTYPES = ("fp16", "fp32") if INTERPRETED else None

# Every dtype of the spec (one test id each), over the preset's regimes and sizes.
test_attention = flashcheck.property_test(attention, dtypes=DTYPES)


# Our own hypothesis test: the regimes that broke flash kernels before, with causal masking.
@pytest.mark.flashcheck  # counted in flashcheck's summary, no hypothesis deadline
@settings(max_examples=8)
@given(cases(spec=attention.spec, dtypes=DTYPES, value_regimes=("growing_max", "huge_logits", "ties"),
             min_n=30, max_n=70, max_batch=1, max_heads=1, head_dims=[32]))
def test_attention_adversarial(case):
    flashcheck.assert_passes(attention, case)
