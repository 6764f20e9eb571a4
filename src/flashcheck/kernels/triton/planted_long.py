"""The planted bugs of ``flashcheck:triton`` that only long rows or large tensors show (the long-context preset
draws them). The self-test's short cases cannot, so it leaves them out; ``flashcheck:triton~NAME`` loads them as
any other (:mod:`.mutants`)."""

from __future__ import annotations

from .planted import Mutant

__all__ = ["LONG_MUTANTS"]


_BASES = ("    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh\n"
          "    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh\n"
          "    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh\n"
          "    o_base = Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh\n")

LONG_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "int32_offsets", "offsets",
        "The base offsets of each (batch entry, head) are computed in int32, program id times stride: past 2^31 "
        "elements they wrap, and the kernel reads and writes another head's memory or none at all.",
        ((_BASES, _BASES.replace(".to(tl.int64)", "")),),
        "A batch entry that starts 2^31 elements into its tensor (the long-context preset's past_int32 cases).",
    ),
    Mutant(
        "key_position_in_fp16", "bounds",
        "The key tile's start position goes through fp16, as in a kernel that keeps its position arithmetic "
        "in the inputs' dtype: exact for the first 65,536 keys (multiples of the tile, below fp16's 65,504), "
        "infinite after them, so the later tiles read the wrong keys or none.",
        (("        cols = start_n + offs_n\n",
          "        cols = (start_n + 0 * offs_n).to(tl.float16).to(tl.int32) + offs_n\n"),),
        "More than 65,536 keys (the long-context preset's decode steps reach 1M).",
    ),
)
