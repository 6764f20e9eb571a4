"""The planted bugs of the built-in kernels, one catalog: defects a kernel author could really write, planted on
purpose so that flashcheck is seen to find them (``KERNEL~NAME``). The table of built-ins (:mod:`.builtins`)
gives each kernel its own from here; ``flashcheck kernels`` lists them, and resolving ``KERNEL~NAME`` checks the
name against them before the kernel's factory plants it.

Two kinds, by how they are made:

- :class:`PlantedBug`: a switch in the kernel's own code, which its factory's ``mutant=`` turns on (the PyTorch
  references of the serving forms and of fp8, and flashcheck's Triton kernels of those forms). A defect that two
  kernels share (``torch:varlen`` and ``flashcheck:triton-varlen``, say) is one record.
- :class:`~.triton.planted.Mutant`: text edits of ``flashcheck:triton``'s source (``forward.py``, ``backward.py``),
  with the area of the algorithm they break and the inputs that expose them; :mod:`.triton.mutants` loads them.

Nothing here imports torch or triton.
"""

from __future__ import annotations

from dataclasses import dataclass

from .triton.planted import BACKWARD_MUTANTS, MUTANTS
from .triton.planted_defects import DEFECT_MUTANTS
from .triton.planted_long import LONG_MUTANTS
from .triton.planted_variants import VARIANT_BACKWARD_MUTANTS, VARIANT_MUTANTS

__all__ = ["FP8", "FP8_KV_BLOCKS", "FP8_KV_TENSOR", "FP8_TRITON", "INT8_QK", "MLA", "MLA_FP8", "NVFP4", "PAGED", "PlantedBug",
           "SELFTEST", "SELFTEST_BACKWARD", "SELFTEST_BUILTINS", "SPARSE_PAGED", "SPARSE_VARLEN", "SPLIT_KV", "TRITON",
           "TRITON_BLOCK_SPARSE", "TRITON_MLA", "TRITON_SPARSE", "TRITON_VARLEN", "VARLEN"]


@dataclass(frozen=True)
class PlantedBug:
    """A defect planted by a switch in the kernel's code: ``name`` is what its factory's ``mutant=`` takes."""

    name: str
    description: str  # what the kernel then does wrong


_READS_PAST_END = PlantedBug("reads_past_end", "each sequence also attends the key just past its end")

# The serving forms (flashcheck.kernels.serving and split_kv; kernels/triton/varlen.py, paged.py, split_kv.py).
VARLEN = (
    _READS_PAST_END,
    PlantedBug("shared_offsets", "the keys' offsets taken from cu_seqlens_q"),
    PlantedBug("ignores_seqused_k", "every key of a sequence's cu_seqlens_k span is attended, past its seqused_k too"),
)
TRITON_VARLEN = (_READS_PAST_END,)
PAGED = (
    PlantedBug("page_off_by_one", "the first key of every page after the first is read from the page before"),
    PlantedBug("ignores_cache_len", "every slot of a sequence's pages is attended, past its cache length too"),
)
# The merge defects users reported: empty splits turned into NaN (FlashInfer 4051, vLLM PR 39148) and partial lse
# in base 2 fed to a natural-log merge (vLLM PR 52796).
SPLIT_KV = (
    PlantedBug("empty_split_nan",
               "an empty split's partial output is 0 / 0 = NaN, and the merge multiplies it by its weight 0"),
    PlantedBug("lse_base2", "the partial lse are in base 2 and the merge exponentiates them as natural logs"),
)

# Multi-head latent attention (kernels/mla.py): the cached row [latent | rope] misread, each a mistake of absorbing
# the projections into one row: the scale of the row's width instead of the model's, the rope part left out of the
# logits, V taken from the row's end or one column late.
MLA = (
    PlantedBug("scale_of_row", "the scale is 1/sqrt(576), the cached row's width, instead of the scale passed"),
    PlantedBug("drops_rope", "the logits are q . k over the 512 latent columns only: the rope part is left out"),
    PlantedBug("values_from_rope_end", "V is read as the row's last 512 columns (kv[..., 64:576]), rope included"),
    PlantedBug("split_off_by_one", "the latent view starts one column late: V = kv[..., 1:513]"),
)
# flashcheck:triton-mla (kernels/triton/mla.py): the same misreads, and a defect of its split-KV workspace, which it
# keeps across calls as serving engines do.
TRITON_MLA = MLA + (
    PlantedBug("merges_empty_splits", "a split that received no keys writes no partial state, so the merge takes in "
               "the stale state an earlier call left in the reused workspace"),
)

# FlashMLA's fp8 latent cache (kernels/mla_fp8.py): the packed row misread. Its fp32 scales cast through e8m0, rounded
# toward zero to a power of two (FlashMLA PR 184: SM100's sparse decode), read one block late, or divided by; the rope
# read as e4m3 codes (the 576-code layout of other engines' fp8 caches); and torch:mla's misreads of the rope.
_MLA = {bug.name: bug for bug in MLA}
MLA_FP8 = (
    PlantedBug("scales_through_e8m0", "each fp32 scale is cast to e8m0 rounding toward zero, 2^floor(log2 s), as "
               "FlashMLA's SM100 sparse decode did before PR 184"),
    PlantedBug("scale_of_next_block", "latent block i takes the fp32 at bytes 512 + 4 (i + 1): the next block's scale, "
               "and for the last block the first two rope values' bytes"),
    PlantedBug("scale_divides", "the codes are divided by their scale instead of multiplied"),
    PlantedBug("rope_read_as_codes", "the rope is read as 64 e4m3 codes (the first 64 of its 128 bytes) times the last "
               "latent block's scale"),
    _MLA["drops_rope"], _MLA["values_from_rope_end"],
)

# Sparse index sets (kernels/sparse.py): the lists misread as users reported (FlashMLA PR 184: indices past the keys
# not masked; padding read as a key; duplicates counted by a gather that a mask-based convention counts once; a set
# trusted to be causal).
SPARSE = (
    PlantedBug("padding_reads_key0", "a -1 padding entry is read as key 0 (clamped, never masked)"),
    PlantedBug("past_end_clamped", "an index past the keys is read as the last key instead of masked"),
    PlantedBug("counts_duplicates", "a key listed twice is gathered twice, the convention declared counts it once"),
    PlantedBug("stops_at_padding", "a list is read up to its first -1: entries after padding are dropped"),
    PlantedBug("ignores_causal", "the set is trusted: keys past the causal diagonal that it lists are attended"),
)
# Index sets on the serving forms (kernels/sparse_serving.py): a position in the sequence misread as a row of the
# form's storage, as engines that turn an indexer's positions into cache slots can (vLLM converts them through the
# block table; FlashMLA's sparse decode takes the slots).
SPARSE_VARLEN = (
    PlantedBug("global_positions", "a position in the sequence is read as a row of the packed k and v: the "
               "sequence's offset from cu_seqlens_k is never added"),
    PlantedBug("bounds_by_longest", "an index is masked against max_seqlen_k, not its own sequence's key count: "
               "one past the end reads the next sequence's keys"),
)
SPARSE_PAGED = (
    PlantedBug("ignores_block_table", "a position is read as a slot of the page pool in pool order: the block table "
               "is never applied"),
    PlantedBug("padding_reads_slot0", "a -1 padding entry is read as the pool's first slot (page 0, slot 0)"),
)
# flashcheck:triton-sparse (kernels/triton/sparse.py): torch:sparse's misreads of the lists that a gather kernel
# writes (a test dropped from its load masks), and the backward's scatter of dK and dV written, not added.
_SPARSE = {bug.name: bug for bug in SPARSE}
# The backward of both Triton sparse kernels: a key's dK and dV stored where they must be added atomically.
_DK_WRITTEN = PlantedBug("dk_written_not_added", "the backward stores each key's dK and dV where it should add them "
                         "atomically: of the query rows that see a key, the last to write wins")
TRITON_SPARSE = (_SPARSE["padding_reads_key0"], _SPARSE["counts_duplicates"], _SPARSE["past_end_clamped"], _DK_WRITTEN)

# Block-sparse lists (kernels/block_sparse.py): a count read one too far (FlexAttention's kv_num_blocks), the partial
# tail block attended as a whole one, full-block lists trusted though declared masked, the mask skipped in partial
# blocks.
BLOCK_SPARSE = (
    PlantedBug("count_off_by_one", "each row's list is read one entry past its kv_num_blocks"),
    PlantedBug("tail_block_padded", "the partial last key block is attended whole: its missing keys as zero keys"),
    PlantedBug("full_list_trusted", "full blocks are attended whole, the mask skipped, though declared masked"),
    PlantedBug("partial_as_full", "listed blocks are attended whole: the causal alignment and the mask skipped"),
)
# flashcheck:triton-block-sparse (kernels/triton/block_sparse.py): the misreads of the lists a Triton kernel over
# key blocks writes (a count read one too far, the tail block's bounds test dropped, full blocks trusted though
# declared masked), and the backward's dK and dV written, not added.
_BLOCK_SPARSE = {bug.name: bug for bug in BLOCK_SPARSE}
TRITON_BLOCK_SPARSE = (
    _BLOCK_SPARSE["count_off_by_one"],
    PlantedBug("tail_block_as_full", "the partial last key block is loaded without its bounds test: the positions "
               "past the keys are attended as keys of zeros"),
    _BLOCK_SPARSE["full_list_trusted"],
    _DK_WRITTEN,
)

# fp8 with FA3's descales (kernels/fp8.py, kernels/triton/fp8.py): the descale defects users reported (FlashInfer
# 1023 and 4979: scales silently dropped).
_IGNORES_K_DESCALE = PlantedBug("ignores_k_descale", "k_descale is never applied (taken as 1)")
FP8 = (_IGNORES_K_DESCALE, PlantedBug("v_descale_twice", "v_descale multiplies the output twice"))
FP8_TRITON = (_IGNORES_K_DESCALE,)
# Block-scaled fp8 (kernels/fp8_blocks.py, kernels/triton/fp8_kv_blocks.py): a block scale read at the wrong block,
# a zero scale divided by (aiter 4289's 0/0), the partial last block left unscaled, e8m0 scales cast as e4m3
# (FlashMLA PR 184) and P saturated while its row sum is not (FA 2716).
KV_BLOCK_SCALES = (
    PlantedBug("scale_of_next_block_at_edge", "key j's K block scale is read at (j + 1) // block: each block's last key "
               "is scaled by the next block's scale (past the last block, by the last block's)"),
    PlantedBug("zero_scale_divides", "V is brought to its block's largest scale before P @ V, v * (s / s_max), and "
               "multiplied by s_max after: an all-zero block (scale 0) gives 0 / 0 = NaN"))
FP8_KV_BLOCKS = KV_BLOCK_SCALES + (
    PlantedBug("k_scale_ignored_in_tail", "the K block scale of the last, partial key block is never applied "
               "(taken as 1)"),)
MXFP8 = (
    PlantedBug("e8m0_read_as_e4m3", "k's e8m0 block scales are read as e4m3 bits (FlashMLA PR 184's cast)"),
    PlantedBug("p_sum_unclamped", "P's block scale follows the OCP rule (2^(floor(log2 max) - 8)): its largest codes "
               "saturate at 448, while the row sum takes P unclamped (FA 2716)"))

# NVFP4 (kernels/fp8_blocks.py): its e4m3 block scales cast as MX's e8m0, its second-level scale dropped, a block's
# last dim scaled by the next block's, and a zero scale divided by.
NVFP4 = (
    PlantedBug("e4m3_read_as_e8m0", "k's e4m3 block scales are read as e8m0 bits (2^(bits - 127))"),
    PlantedBug("global_scale_forgotten", "k_global_scale is never applied (taken as 1)"),
    PlantedBug("dim_scale_of_next_block_at_edge", "k's block scale of dim d is read at block (d + 1) // 16: each block's "
               "last dim is scaled by the next block's scale (past the last block, by the last block's)"),
    KV_BLOCK_SCALES[1])

# FlashInfer's fp8 KV cache beside an unquantized q (kernels/fp8_kv_tensor.py): k_scale both folded into the softmax
# scale and dequantized into K, v_scale dropped (FlashInfer 1023 and 4979), the cache dtype's string mapped to the other
# fp8 format, and P rounded to the cache's fp8 for P @ V as FA3's fp8 path does, not to q's dtype.
FP8_KV_TENSOR = (
    PlantedBug("k_scale_twice", "k_scale is folded into the softmax scale and multiplies K's codes as well"),
    PlantedBug("v_scale_forgotten", "the output is never multiplied by v_scale (taken as 1)"),
    PlantedBug("codes_read_as_other_fp8", "the cache's bits are read as the other fp8 format (e4m3 as e5m2, e5m2 as "
               "e4m3): a cache dtype name mapped to the wrong torch dtype"),
    PlantedBug("p_in_fp8", "P is rounded to the cache's fp8 format for P @ V, not to q's dtype"))

INT8_QK = (
    PlantedBug("padded_keys_unmasked", "without a causal mask the keys a last partial tile of 64 pads take score 0 "
               "and value 0 (SageAttention 1.0.6's defect)"),
    PlantedBug("first_block_scale_everywhere", "every block of 128 queries takes the first block's q scale"),
    PlantedBug("scores_in_fp16", "the scores, integer dot times the scales, are rounded to fp16 before the softmax"))

# flashcheck:triton's, in the order `flashcheck kernels` lists them; the self-test's leave out the long ones,
# which its short cases cannot show, and those of the defect models, which their models' tests run.
TRITON = MUTANTS + BACKWARD_MUTANTS + VARIANT_MUTANTS + VARIANT_BACKWARD_MUTANTS + LONG_MUTANTS + DEFECT_MUTANTS
SELFTEST = MUTANTS + VARIANT_MUTANTS
SELFTEST_BACKWARD = BACKWARD_MUTANTS + VARIANT_BACKWARD_MUTANTS
# Built-in references the self-test judges after flashcheck:triton's rows: each as a correct row, and each of its
# planted bugs (its name KERNEL~BUG) as a row to be caught. Forward only.
SELFTEST_BUILTINS = {"torch:mla": MLA, "torch:sparse": SPARSE, "torch:block-sparse": BLOCK_SPARSE}
