"""The varlen form: sequences packed one after another, found through ``cu_seqlens_q`` and ``cu_seqlens_k``
(:mod:`flashcheck.contract.forms` gives the convention)."""

from __future__ import annotations

from .forms import Form

FORM = Form("varlen", indices={"out": "[t, h, k]", "lse": "[h, t]"})
