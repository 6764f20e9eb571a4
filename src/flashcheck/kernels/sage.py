"""SageAttention 1.0.6 (``sageattention.sageattn``) as a flashcheck kernel, ``sage:sageattn``: a real third-party
Triton kernel that quantizes inside (int8 Q K^T per block of tokens, P @ V in fp16).

Its convention, mapped onto flashcheck's:
- layout "HND" (B, H, N, D), flashcheck's own; fp16, bf16 or fp32 inputs, head dims 64, 96 and 128; GQA (query
  head h reads K/V head h // (Hq / Hkv)); no lse, no mask, no backward;
- ``is_causal=True`` is top-left and asserts Nq == Nk, so the spec asks equal lengths;
- its numerics are the ``sage_int8`` scheme (:data:`~flashcheck.contract.quantization.SCHEMES`): the oracle attends
  the values its quantizer gives, emulated exactly (:mod:`flashcheck.numerics.quantized_inside`), and the budget
  has P in fp16 and P @ V summed in fp16 per tile of 64 keys. How far those values sit from the inputs is the
  quantization error, which the verdict does not judge.

Its ``smooth_k`` (on by default, as called here) subtracts K's mean over the tokens from the caller's ``k`` in place: flashcheck hands
a kernel copies and reports the write (``input_written``). Option ``seq_multiple=64`` keeps both lengths multiples of
64, leaving out the keys a last partial tile pads (its non-causal path does not mask them).

``sage:sageattn-varlen`` wraps its varlen call, ``sageattn_varlen``, on flashcheck's varlen form (the same
tensors): head dims 64 and 128, equal lengths per sequence (its causal mask asks them), its numerics the
``sage_int8_packed`` scheme, whose k mean spans every packed token (:mod:`flashcheck.numerics.sage_packed`), so
one sequence's keys move another's codes: its spec makes no batch-invariance promise. Its option
``seq_multiple=64`` declines (:class:`~flashcheck.errors.Unsupported`) a batch with a sequence whose length is
not a multiple of 64.

``pip install sageattention==1.0.6`` (20 KB, pure Triton). On the CPU it runs under the Triton interpreter
(``TRITON_INTERPRET=1``); ``sageattn`` asserts ``q.is_cuda`` first, so there the call runs with that one check
answered yes for its duration (``sageattn_varlen`` too), and nothing else of the package changed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os

import torch

from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable, Unsupported
from .adapters import import_backend
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON

__all__ = ["NAME", "DESCRIPTION", "VARLEN_NAME", "VARLEN_DESCRIPTION", "make_sage_kernel", "make_sage_varlen_kernel",
           "unavailable"]

NAME = "sage:sageattn"
DESCRIPTION = ("SageAttention 1.0.6's sageattn: int8 Q K^T quantized inside per block of tokens, P @ V in fp16 "
               "(option seq_multiple=64: lengths a multiple of its key tile)")
VARLEN_NAME = "sage:sageattn-varlen"
VARLEN_DESCRIPTION = ("SageAttention 1.0.6's sageattn_varlen on packed sequences: sageattn's int8 quantizer per "
                      "sequence, k's mean over the whole batch (option seq_multiple=64)")
_INSTALL = "pip install sageattention==1.0.6"


def unavailable(device: str, name: str = NAME) -> BackendUnavailable | None:
    """Why ``name`` (``sage:sageattn`` or ``sage:sageattn-varlen``) cannot run on ``device``, without importing it
    (that jits its kernels); None if it can."""
    if device == "cuda" and not torch.cuda.is_available():
        return BackendUnavailable(name, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)
    if importlib.util.find_spec("sageattention") is None:
        return BackendUnavailable(name, device, "sageattention is not installed", _INSTALL)
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return BackendUnavailable(name, "cpu", "SageAttention's Triton kernels run on the CPU only under the Triton "
                                  "interpreter", "Set TRITON_INTERPRET=1 before Python starts (--device cpu does).")
    return None


@contextlib.contextmanager
def _cuda_check_answered(device: str):
    """On the CPU, ``Tensor.is_cuda`` reads True while sageattn runs (its first assert), and is restored."""
    if device != "cpu":
        yield
        return
    saved = torch.Tensor.is_cuda
    torch.Tensor.is_cuda = property(lambda self: True)
    try:
        yield
    finally:
        torch.Tensor.is_cuda = saved


def make_sage_kernel(*, device: str = "cuda", seq_multiple: int = 1) -> Kernel:
    """``sage:sageattn`` on ``device`` (CUDA compiled; the CPU under the Triton interpreter)."""
    problem = unavailable(device)
    if problem is not None:
        raise problem
    sageattn = import_backend(NAME, "sageattention", problem="sageattention is not installed", fix=_INSTALL).sageattn

    def attention(q, k, v, *, scale, causal="none", attn_mask=None):
        with _cuda_check_answered(device):
            return sageattn(q, k, v, tensor_layout="HND", is_causal=causal != "none", sm_scale=scale)

    spec = KernelSpec(dtypes=("fp16", "bf16", "fp32"), causal=("none", "top_left"), gqa=True, head_dims=(64, 96, 128),
                      equal_lengths=True, seq_multiple=seq_multiple, fully_masked_rows="any", precision="flash",
                      devices=(device,), quantization="sage_int8")
    return Kernel(attention, spec, name=NAME)


def _off_the_grid(cu_seqlens: torch.Tensor, multiple: int) -> None:
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    if any(n % multiple for n in lengths):
        raise Unsupported(f"sequence lengths {lengths}: not all multiples of {multiple} (option seq_multiple)")


def make_sage_varlen_kernel(*, device: str = "cuda", seq_multiple: int = 1) -> Kernel:
    """``sage:sageattn-varlen`` on ``device`` (CUDA compiled; the CPU under the Triton interpreter)."""
    problem = unavailable(device, VARLEN_NAME)
    if problem is not None:
        raise problem
    package = import_backend(VARLEN_NAME, "sageattention", problem="sageattention is not installed", fix=_INSTALL)

    def attention(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal="none"):
        if seq_multiple > 1:
            _off_the_grid(cu_seqlens_k, seq_multiple)  # equal lengths: q's are k's
        with _cuda_check_answered(device):
            return package.sageattn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                           is_causal=causal != "none", sm_scale=scale)

    spec = KernelSpec(form="varlen", dtypes=("fp16", "bf16", "fp32"), causal=("none", "top_left"), gqa=True,
                      head_dims=(64, 128), equal_lengths=True, seq_multiple=seq_multiple, fully_masked_rows="any",
                      precision="flash", devices=(device,), quantization="sage_int8_packed", batch_invariant=False)
    return Kernel(attention, spec, name=VARLEN_NAME)
