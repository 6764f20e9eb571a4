"""The built-in kernels, one table: each name with what it is, the options it takes, the function that makes it,
how to tell whether it can run here, and its planted bugs (:mod:`.planted`). The registry resolves names through
it and ``flashcheck kernels`` lists it; its names lie under :data:`~.origin.RESERVED_PREFIXES`, never import
paths.

Nothing here imports triton: flashcheck's Triton kernels of the serving forms and fp8 live in modules that import
it when imported, so their factories are imported on first use (:class:`TritonModule`), and ``flashcheck:triton``
imports it when its kernel is first called. On the CPU, making a Triton kernel sets ``TRITON_INTERPRET=1``
(Triton reads it when a kernel is jitted).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from ..contract.spec import Kernel
from ..errors import BackendUnavailable
from .fla import DECODING_NAME as FLA_DECODING
from .fla import NAME as FLA
from .fla import VARLEN_NAME as FLA_VARLEN
from .fla import make_fla_decoding_kernel, make_fla_kernel
from .fla import unavailable as fla_unavailable
from .sage import DESCRIPTION as SAGE_DESCRIPTION
from .sage import NAME as SAGE
from .sage import VARLEN_DESCRIPTION as SAGE_VARLEN_DESCRIPTION
from .sage import VARLEN_NAME as SAGE_VARLEN
from .sage import make_sage_kernel, make_sage_varlen_kernel
from .sage import unavailable as sage_unavailable
from .sglang_mla import DESCRIPTION as SGLANG_MLA_DESCRIPTION
from .sglang_mla import NAME as SGLANG_MLA
from .sglang_mla import make_sglang_mla_kernel
from .sglang_mla import unavailable as sglang_unavailable
from .flex import NAME as FLEX
from .flex import make_flex_kernel
from .flex_varlen import NAME as FLEX_VARLEN
from .flex_varlen import make_flex_varlen_kernel
from .planted import FP8 as PLANTED_FP8
from .planted import (BLOCK_SPARSE, FP8_KV_BLOCKS, FP8_KV_TENSOR, FP8_TRITON, MLA, MLA_FP8, PAGED, SPARSE, SPARSE_PAGED,
                      SPARSE_VARLEN, SPLIT_KV, TRITON_BLOCK_SPARSE, TRITON_MLA, TRITON_SPARSE, TRITON_VARLEN, VARLEN)
from .planted import TRITON as PLANTED_TRITON
from .fp8 import FP8, make_fp8_kernel
from .fp8_blocks import MAKERS as BLOCK_SCALED_MAKERS
from .fp8_blocks import PLANTED as PLANTED_BLOCK_SCALED
from .fp8_kv_tensor import NAME as FP8_KV_TENSOR_NAME
from .fp8_kv_tensor import make_fp8_kv_tensor_kernel
from .int8_qk import NAME as INT8_QK
from .int8_qk import PLANTED as PLANTED_INT8_QK
from .int8_qk import make_int8_qk_kernel
from .mla import make_mla_kernel
from .mla_fp8 import NAME as MLA_FP8_NAME
from .mla_fp8 import make_mla_fp8_kernel
from .block_sparse import make_block_sparse_kernel
from .flex_blocks import NAME as FLEX_BLOCKS
from .flex_blocks import make_flex_block_sparse_kernel
from .sparse import make_sparse_kernel
from .sparse_serving import make_sparse_serving_kernel
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON, SDPA_KERNELS, make_sdpa_kernel
from .serving import make_serving_kernel
from .triton.forward import jitted_for_the_gpu, make_kernel, on_device
from .triton.mutants import load_mutant
from .triton.runtime import BACKEND_NAME as TRITON

__all__ = ["BUILTINS", "Builtin", "Option", "TritonModule", "builtin", "triton_unavailable"]

TRITON_FP8 = "flashcheck:triton-fp8"
TRITON_FP8_KV_BLOCKS = "flashcheck:triton-fp8-kv-blocks"
_INTERPRETED = "on the CPU under the Triton interpreter"


@dataclass(frozen=True)
class Option:
    """An option of a built-in (``NAME[option=value]``): a keyword of its factory, with the default and the type
    the factory declares."""

    name: str
    default: object
    type: str


def options_of(factory: Callable) -> tuple[Option, ...]:
    """The options a factory takes: its keywords, but the device and the planted bug."""
    params = inspect.signature(factory).parameters.values()
    return tuple(Option(p.name, p.default, p.annotation) for p in params
                 if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in ("device", "mutant"))


@dataclass(frozen=True)
class Builtin:
    """One built-in kernel.

    ``make(device=..., **options)`` makes it, and with ``mutant=NAME`` one of its ``planted`` bugs; it raises
    :class:`BackendUnavailable` where the kernel cannot run. ``unavailable(device)`` says why it cannot run
    without making it, for the kernels that making would change something for (a Triton kernel's first jit fixes
    compiling or interpreting for the process); where it is None, making the kernel is how to find out.
    """

    name: str
    description: str
    make: Callable[..., Kernel]
    options: tuple[Option, ...] = ()
    planted: tuple = ()  # its planted bugs (PlantedBug or triton.planted.Mutant), in listing order
    unavailable: Callable[[str], BackendUnavailable | None] | None = None


# ------------------------------------------------------------------------------------------------
# Whether Triton can run here, and the Triton kernels' factories
# ------------------------------------------------------------------------------------------------


def triton_unavailable(device: str, name: str = TRITON) -> BackendUnavailable | None:
    """Why the Triton kernel ``name`` cannot run on ``device``, without changing anything; None if it can."""
    if importlib.util.find_spec("triton") is None:
        fix = "pip install 'flashcheck[cpu]' for the CPU interpreter." if device == "cpu" else "pip install triton."
        return BackendUnavailable(name, device, "triton is not installed", fix)
    if device == "cuda":
        if not torch.cuda.is_available():
            return BackendUnavailable(name, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)
        if os.environ.get("TRITON_INTERPRET") == "1":
            return BackendUnavailable(name, "cuda", "TRITON_INTERPRET=1 is set, so Triton would run the kernel in "
                                      "its CPU interpreter instead of compiling it for the GPU",
                                      "Unset TRITON_INTERPRET before starting Python, or use --device cpu.")
        return None
    # Triton decides between compiling and interpreting when a kernel is jitted; flashcheck jits its
    # kernel on the first call, so only a kernel already jitted for the GPU makes the switch too late.
    # (Triton itself may already be imported: torch._dynamo imports it, e.g. via torch.nn.attention.bias.)
    if os.environ.get("TRITON_INTERPRET") != "1" and jitted_for_the_gpu():
        return BackendUnavailable(
            name, "cpu", "triton was already imported and flashcheck's kernel jitted without TRITON_INTERPRET=1, "
            "so Triton cannot switch to its CPU interpreter in this process",
            "Set TRITON_INTERPRET=1 before importing triton (or run flashcheck's CLI with --device cpu, which does it).",
        )
    return None


def _prepare_triton(name: str, device: str) -> None:
    """Refuse where the Triton kernel ``name`` cannot run; on the CPU, have Triton interpret it."""
    problem = triton_unavailable(device, name)
    if problem is not None:
        raise problem
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"


def _make_triton(*, device: str, mutant: str | None = None, **options) -> Kernel:
    _prepare_triton(TRITON, device)
    return on_device(make_kernel(**options) if mutant is None else load_mutant(mutant, **options), device)


@dataclass(frozen=True)
class TritonModule:
    """The factory ``function(device=..., mutant=...)`` of ``flashcheck.kernels.triton.<module>``, a module that
    imports triton when imported: imported on the first call, once Triton can run the kernel ``name``."""

    name: str
    module: str
    function: str

    def __call__(self, *, device: str, mutant: str | None = None) -> Kernel:
        _prepare_triton(self.name, device)
        return getattr(importlib.import_module(f"{__package__}.triton.{self.module}"), self.function)(
            device=device, mutant=mutant)


def _make_triton_fp8(*, device: str, mutant: str | None = None) -> Kernel:
    if device == "cpu":  # measured: its fp32 -> fp8 casts lose the carry into the exponent (tests/interpreter)
        raise BackendUnavailable(TRITON_FP8, "cpu", "the Triton interpreter rounds fp32 to fp8 wrongly (values that "
                                 "round up to a power of two come out at the power of two below)",
                                 "Run it on a GPU with fp8 tensor cores (compute capability 8.9 or newer).")
    return TritonModule(TRITON_FP8, "fp8", "make_fp8_triton_kernel")(device=device, mutant=mutant)


def _triton_form(name: str, module: str, function: str, description: str, bugs: tuple) -> Builtin:
    return Builtin(name, f"{description} ({_INTERPRETED})", TritonModule(name, module, function), planted=bugs,
                   unavailable=partial(triton_unavailable, name=name))


def _serving(name: str, description: str, bugs: tuple = (), options: tuple = ()) -> Builtin:
    return Builtin(name, description, partial(make_serving_kernel, name), options, bugs)


# ------------------------------------------------------------------------------------------------
# The table
# ------------------------------------------------------------------------------------------------

_SDPA_BACKEND = " (option backend=math|flash|efficient|cudnn)"

BUILTINS: tuple[Builtin, ...] = (
    *(Builtin(name, description, partial(make_sdpa_kernel, name)) for name, (_, description) in SDPA_KERNELS.items()),
    Builtin(FLEX, "PyTorch FlexAttention, the torch.compile'd fused kernel (options compile=False: unfused eager "
            "path; alibi=linear: ALiBi as slope (j - i))", make_flex_kernel, options_of(make_flex_kernel)),
    Builtin(TRITON, "flashcheck's own Triton flash-attention kernel (tile sizes and compiler settings as options; "
            "alibi=linear: ALiBi as slope (j - i); on the CPU it runs under the Triton interpreter)", _make_triton,
            options_of(make_kernel), PLANTED_TRITON, triton_unavailable),
    # importing fla jits its kernels: fla_unavailable only looks for it
    Builtin(FLA, "flash-linear-attention's Triton softmax attention (fla-core's parallel_attn: causal, window, "
            "sinks; pip install fla-core einops)", partial(make_fla_kernel, form="dense"),
            unavailable=partial(fla_unavailable, name=FLA)),
    Builtin(FLA_VARLEN, "fla-core's parallel_attn on a packed varlen batch (its cu_seqlens: each sequence's "
            "queries are its keys)", partial(make_fla_kernel, form="varlen"),
            unavailable=partial(fla_unavailable, name=FLA_VARLEN)),
    Builtin(FLA_DECODING, "fla-core's attn_decoding_one_step on a packed varlen batch: each query as a decoding "
            "step at the end of its key prefix (bottom-right causal)", make_fla_decoding_kernel,
            unavailable=partial(fla_unavailable, name=FLA_DECODING)),
    Builtin(SGLANG_MLA, SGLANG_MLA_DESCRIPTION + "; pip install sglang", make_sglang_mla_kernel,
            unavailable=sglang_unavailable),
    Builtin(SAGE, SAGE_DESCRIPTION + "; pip install sageattention==1.0.6", make_sage_kernel,
            options_of(make_sage_kernel), unavailable=sage_unavailable),
    Builtin(SAGE_VARLEN, SAGE_VARLEN_DESCRIPTION + "; pip install sageattention==1.0.6", make_sage_varlen_kernel,
            options_of(make_sage_varlen_kernel), unavailable=partial(sage_unavailable, name=SAGE_VARLEN)),
    _serving("torch:varlen", "packed variable-length batches (flash-attention's varlen convention, seqused_k "
             "included), one PyTorch SDPA call per sequence" + _SDPA_BACKEND, VARLEN,
             options_of(make_serving_kernel)),
    _serving("torch:paged", "a paged KV cache with a block table (flash-attention's kvcache convention), one PyTorch "
             "SDPA call per sequence" + _SDPA_BACKEND, PAGED, options_of(make_serving_kernel)),
    # torch:jagged and torch:split-kv run no SDPA backend: no option
    _serving("torch:jagged", "PyTorch's jagged nested tensors through scaled_dot_product_attention, one call for the "
             "packed batch (varlen; no causal mask, no GQA)"),
    _serving("torch:split-kv", "split-KV decoding over a paged cache in fp32, judged at 1, 2, 3, 16 and 32 splits, "
             "with its own merge of the partial states", SPLIT_KV),
    Builtin(FLEX_VARLEN, "FlexAttention on a packed varlen batch with a document mask (causal per document; "
            "option compile=False: unfused eager path)", make_flex_varlen_kernel,
            options_of(make_flex_varlen_kernel)),
    _triton_form("flashcheck:triton-varlen", "varlen", "make_varlen_kernel",
                 "flashcheck's own Triton kernel over packed varlen batches", TRITON_VARLEN),
    _triton_form("flashcheck:triton-paged", "paged", "make_paged_kernel", "flashcheck's own Triton kernel over a "
                 "paged KV cache with a block table, any page size", PAGED),
    _triton_form("flashcheck:triton-split-kv", "split_kv", "make_split_kv_kernel", "flashcheck's own Triton "
                 "split-KV decoding over a paged cache: partial states, then a Triton merge; judged at 1, 2, 3, 16 "
                 "and 32 splits", SPLIT_KV),
    Builtin(FP8, "fp8 attention (e4m3, e5m2) with FA3's q/k/v descales in torch: fp32 scores, P rounded to fp8, bf16 "
            "out", make_fp8_kernel, planted=PLANTED_FP8),
    Builtin(TRITON_FP8, "flashcheck's own Triton kernel on fp8 inputs with FA3's descales (fp8 tensor-core dots; GPU "
            "only: the Triton interpreter's fp8 conversion rounds wrongly)", _make_triton_fp8,
            planted=FP8_TRITON),
    Builtin("torch:fp8-kv-token", "an fp8 KV cache with an fp32 scale per token and K/V head (vLLM's per-token-head "
            "scales) in torch: q, k, v dequantized and rounded to bf16, P in bf16, bf16 out",
            BLOCK_SCALED_MAKERS["torch:fp8-kv-token"], planted=PLANTED_BLOCK_SCALED["torch:fp8-kv-token"]),
    Builtin("torch:fp8-kv-blocks", "an fp8 KV cache with an fp32 scale per block of 16 tokens and K/V head in "
            "torch: as torch:fp8-kv-token", BLOCK_SCALED_MAKERS["torch:fp8-kv-blocks"],
            planted=PLANTED_BLOCK_SCALED["torch:fp8-kv-blocks"]),
    Builtin(FP8_KV_TENSOR_NAME, "FlashInfer's and vLLM's fp8 KV cache in torch (the per_tensor_kv scheme): q fp16 or "
            "bf16, k and v fp8 codes with one fp32 k_scale and v_scale, k_scale folded into the softmax scale, the "
            "codes cast to q's dtype, P in it, the output times v_scale after its rounding (option codes=e4m3|e5m2)",
            make_fp8_kv_tensor_kernel, options_of(make_fp8_kv_tensor_kernel), FP8_KV_TENSOR),
    Builtin("torch:mxfp8", "MXFP8 attention in torch: e4m3 codes with an e8m0 scale per 32 values along each product's "
            "contracted axis, P requantized to e4m3 with an e8m0 scale per 32 keys, bf16 out",
            BLOCK_SCALED_MAKERS["torch:mxfp8"], planted=PLANTED_BLOCK_SCALED["torch:mxfp8"]),
    Builtin("torch:nvfp4", "NVFP4 attention in torch: e2m1 codes (in fp8_e4m3, read packed two a byte) with an e4m3 "
            "scale per 16 values along each product's contracted axis and an fp32 global scale per tensor, "
            "dequantized and rounded to bf16, P in bf16, bf16 out", BLOCK_SCALED_MAKERS["torch:nvfp4"],
            planted=PLANTED_BLOCK_SCALED["torch:nvfp4"]),
    _triton_form(TRITON_FP8_KV_BLOCKS, "fp8_kv_blocks", "make_fp8_kv_blocks_kernel", "flashcheck's own Triton "
                 "kernel on fp8 inputs whose K and V carry an fp32 scale per block of 16 keys besides FA3's descales "
                 "(the per_block_kv scheme): an fp8 dot for the scores, P and V in bf16 for P @ V, bf16 out",
                 FP8_KV_BLOCKS),
    Builtin(INT8_QK, "the sage_int8 scheme's reference in torch: fp16, bf16 or fp32 inputs quantized inside as "
            "SageAttention 1.0.6 does (int8 codes of q and of k minus its mean, fp32 scales per 128 and 64 tokens), "
            "the integer dot times the scales, P in fp16", make_int8_qk_kernel, planted=PLANTED_INT8_QK),
    Builtin("torch:mla", "multi-head latent attention's absorbed decode in fp32 torch (FlashMLA's convention on the "
            "dense form: kernel(q, kv, *, scale, causal), one cached row of 512 + 64 for K, V its first 512)",
            partial(make_mla_kernel, "torch:mla"), planted=MLA),
    Builtin("torch:mla-paged", "torch:mla over a paged cache (FlashMLA's kvcache call: kernel(q, kv_cache, *, "
            "block_table, cache_seqlens, scale, causal); page sizes 1, 16 and 64)",
            partial(make_mla_kernel, "torch:mla-paged"), planted=MLA),
    Builtin(MLA_FP8_NAME, "MLA decode on FlashMLA's fp8 latent cache in torch (the flashmla_fp8 scheme): each token's "
            "512 e4m3 codes, 4 fp32 scales and 64 bf16 rope values packed in 656 bytes as FlashMLA's kvcache call "
            "takes them, unpacked as its SM90 decode does (code times scale in bf16), torch:mla's fp32 attention",
            make_mla_fp8_kernel, planted=MLA_FP8),
    _triton_form("flashcheck:triton-mla", "mla", "make_mla_triton_kernel", "flashcheck's own Triton MLA absorbed "
                 "decode over a paged cache (torch:mla-paged's call, with num_splits): two fp32 dots per logit, the "
                 "latent tile read once as V, split-KV partial states and a Triton merge; judged at 1, 2, 3 and 16 "
                 "splits", TRITON_MLA),
    Builtin("torch:sparse", "attention over sparse index sets in fp32 torch (indices (B, Hkv or 1, Nq, topk), -1 "
            "padding, duplicates once, indices past the keys masked: kernel(q, k, v, *, scale, causal, attn_mask, "
            "indices)), gathering the listed keys (option duplicates=once|twice)", make_sparse_kernel,
            options_of(make_sparse_kernel), SPARSE),
    Builtin("torch:sparse-varlen", "torch:sparse on packed varlen batches: indices (total_q, Hkv or 1, topk) packed "
            "as q, each entry a position in its query's own sequence", partial(make_sparse_serving_kernel,
            "torch:sparse-varlen"), planted=SPARSE_VARLEN),
    Builtin("torch:sparse-paged", "torch:sparse over a paged KV cache: indices (B, Nq, Hkv or 1, topk) laid out as q, "
            "each entry a position in its sequence, read through the block table", partial(
                make_sparse_serving_kernel, "torch:sparse-paged"), planted=SPARSE_PAGED),
    Builtin("torch:mla-sparse", "DeepSeek V3.2's sparse MLA decode in fp32 torch: torch:mla-paged's call with indices "
            "(B, Nq, 1, topk), each entry a position in its sequence, read through the block table",
            partial(make_sparse_serving_kernel, "torch:mla-sparse"), planted=SPARSE_PAGED),
    _triton_form("flashcheck:triton-sparse", "sparse", "make_sparse_kernel", "flashcheck's own Triton top-k gather "
                 "attention over sparse index sets (torch:sparse's convention; a repeated key attended once)",
                 TRITON_SPARSE),
    Builtin("torch:block-sparse", "attention over key-block lists in fp32 torch (FlexAttention's kv_num_blocks, "
            "kv_indices and full_kv_* of blocks 16 x 32; option full_blocks=masked|trusted)", make_block_sparse_kernel,
            options_of(make_block_sparse_kernel), BLOCK_SPARSE),
    Builtin(FLEX_BLOCKS, "FlexAttention's block-sparse path: the case's key-block lists as its BlockMask "
            "(from_kv_blocks; full blocks trusted; options q_block, kv_block (128), compile=False: eager path)",
            make_flex_block_sparse_kernel, options_of(make_flex_block_sparse_kernel)),
    _triton_form("flashcheck:triton-block-sparse", "block_sparse", "make_block_sparse_kernel", "flashcheck's own "
                 "Triton block-sparse prefill attention over key-block lists (torch:block-sparse's convention, blocks "
                 "16 x 16, full blocks masked)", TRITON_BLOCK_SPARSE),
)

_BY_NAME = {entry.name: entry for entry in BUILTINS}


def builtin(name: str) -> Builtin | None:
    """The built-in named ``name`` (its bare name: no planted bug, no options), or None."""
    return _BY_NAME.get(name)
