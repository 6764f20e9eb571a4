"""PyTorch FlexAttention (``torch:flex``) as a flashcheck kernel.

The causal alignment and the boolean mask become one ``mask_mod`` and a block mask built from it.
By default the kernel under test is the fused kernel that ``torch.compile`` generates (Triton on CUDA,
C++ on the CPU); ``compile=False`` runs flex's eager path, which is an unfused reference (scores
materialised, softmax in fp32, the normalised P rounded to the input dtype before P @ V), useful only
where compiling is impossible.

lse: flex's kernels work in base 2, but ``flex_attention`` converts the returned lse to the natural
log before handing it back (``_finalize_outputs`` multiplies by ln 2), so it is returned unchanged:
(B, Hq, Nq) fp32, natural log, -inf on rows with no visible key. The compiled CPU kernel cannot
return lse (PyTorch: "torch.compile on CPU only supports inference and `return_lse` is not
supported yet"), so there the kernel returns ``out`` only.

Measured: rows with no visible key come out as exactly 0 with lse = -inf (CUDA compiled, torch 2.11
on an H200; CPU compiled and eager, torch 2.13). The compiled CUDA kernel needs D, Dv >= 16.

Variants: the cap, ALiBi and ``attn_bias`` are one ``score_mod``, applied in that order (FlexAttention is
user-ordered; declared ``bias_order="cap_first"``, flash-attention's, the order in which a bias of -inf still
hides its key), symmetric ALiBi (flash-attention's); the window and the chunk join the causal alignment and
the boolean mask in the ``mask_mod``. Every value they use is a captured tensor (the cap a 0-d one), so a
new value is no recompile; a new broadcast pattern of the bias (its strides) is one, as a new shape is.
Sinks are one more key, of zero K and V, whose score is the head's sink and which every query sees: flex
adds e^sink to the row's sum inside the kernel, so the output is rounded once, the lse includes it, and the
compiled CPU kernel (no lse) takes sinks too. The other route, flex's out rescaled by sigmoid(lse - sink)
in fp32, rounds the output twice: measured (eager, CPU, fp16 and bf16, 37 x 53 keys), up to 1.16 times
flashcheck's budget, against 0.52-0.81 with the sink key.
Backward is not declared: the adapter runs under no_grad. Measured: flex has no backward on the CPU
(eager: "does not support backward on CPU"; compiled: inference only, torch 2.13); on CUDA (torch 2.11,
H200, eager and compiled) a captured bias that requires grad gets its gradient (within 6e-6 of fp32's).

GQA uses flex's ``enable_gqa``, except on CUDA with a mask or a variant, where K and V are repeated over the query
heads: there inductor (torch 2.11) failed to compile flex's GQA decoding kernel (see ``flex_heads``).
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import threading
import warnings

import torch

from ..contract.features import ALIBI_MODES
from ..contract.formats import DTYPES
from ..contract.masks import from_tensor
from ..contract.spec import Kernel, KernelSpec
from ..contract.validation import CAUSAL_MODES
from ..errors import BackendUnavailable, InvalidArgument, Unsupported
from .adapters import import_backend, validated_call
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON

__all__ = ["make_flex_kernel", "flex_sink_key", "DESCRIPTION", "check_available", "compiled_flex", "flex_heads",
           "flex_module", "flex_options", "flex_outputs", "restriction_mod", "run_flex"]

NAME = "torch:flex"
DESCRIPTION = "PyTorch FlexAttention (torch.compile'd fused kernel; compile=False: unfused eager path)"

_LOCK = threading.Lock()
_COMPILED: dict = {}

# Every new shape, dtype or mask structure is a recompile; past dynamo's default limit of 8 it
# would silently fall back to the unfused eager path, i.e. test a different kernel. Raise the
# limit and make hitting it an error instead.
_DYNAMO_PATCH = {
    "recompile_limit": 1 << 16,
    "accumulated_recompile_limit": 1 << 16,
    "fail_on_recompile_limit_hit": True,
}


def flex_module():
    return import_backend(NAME, "torch.nn.attention.flex_attention",
                          problem=f"this PyTorch ({torch.__version__}) has no FlexAttention",
                          fix="Upgrade to PyTorch >= 2.5.")


def compiled_flex(fa, device: str):
    with _LOCK:
        if device not in _COMPILED:
            # On the CPU, static shapes: after a recompile, dynamo's automatic dynamic shapes gave C++ that
            # failed to compile (torch 2.13, tests/unit/test_flex_dynamic_shapes.py). On CUDA, torch.compile's
            # default (automatic dynamic shapes), what users run: static shapes cost one Triton compile per
            # new shape, and an H200 campaign judged no case in 90 s.
            _COMPILED[device] = torch.compile(fa.flex_attention, dynamic=False if device == "cpu" else None)
        return _COMPILED[device]


def _dynamo_patch():
    import torch._dynamo as dynamo  # lazy: torch._dynamo costs about a second to import

    config = dynamo.config
    return config.patch(**{k: v for k, v in _DYNAMO_PATCH.items() if hasattr(config, k)})


def _has_cxx() -> bool:
    return any(shutil.which(c) for c in (os.environ.get("CXX") or "g++", "g++", "c++", "clang++"))


def check_available(device: str, compile: bool, *, name: str = NAME) -> None:
    """BackendUnavailable (in the kernel's ``name``) where flex cannot run on ``device`` as ``compile`` asks."""
    if not isinstance(compile, bool):
        raise InvalidArgument("compile", compile, "expected True or False",
                              "Pass compile=True for the fused kernel or compile=False for flex's eager path.")
    flex_module()
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(name, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)
    import torch._dynamo as dynamo  # lazy (about a second); binds only `dynamo`, so `torch` stays the module global

    if not dynamo.is_dynamo_supported():
        raise BackendUnavailable(name, device, "FlexAttention needs TorchDynamo, which this Python does not support",
                                 "Use a Python version that torch.compile supports.")
    if not compile:
        return
    if device == "cuda":
        if importlib.util.find_spec("triton") is None:
            raise BackendUnavailable(name, "cuda", "torch.compile builds flex's CUDA kernel with Triton, which is not "
                                     "installed", "Install triton, or pass compile=False for the unfused eager path.")
        if os.environ.get("TRITON_INTERPRET") == "1":
            raise BackendUnavailable(name, "cuda", "TRITON_INTERPRET=1 is set, so the Triton kernels torch.compile "
                                     "generates would run in Triton's CPU interpreter",
                                     "Unset TRITON_INTERPRET for GPU runs.")
    elif not _has_cxx():
        raise BackendUnavailable(name, "cpu", "torch.compile builds flex's CPU kernel with a C++ compiler and none was "
                                 "found (g++, c++, clang++ or $CXX)",
                                 "Install one (e.g. apt-get install g++), or pass compile=False for the unfused eager path.")


def _causal_mod(offset: torch.Tensor):
    # The offset is a tensor, not a Python int: an int is baked into the compiled kernel, so every
    # new Nk - Nq would recompile (and on the CPU the int form hit a C++ codegen error in torch 2.13).
    def causal_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return causal_mod


def _window_mod(window, offset: torch.Tensor, device):
    # The sides are tensors (one kernel for every width); only which sides are bounded shapes the code.
    left, right = (torch.tensor(w, device=device) if w >= 0 else None for w in window)

    def window_mod(b, h, q_idx, kv_idx):
        centre = q_idx + offset
        out = torch.ones_like(q_idx - kv_idx, dtype=torch.bool)
        if left is not None:
            out = out & (kv_idx >= centre - left)
        if right is not None:
            out = out & (kv_idx <= centre + right)
        return out

    return window_mod


def _chunk_mod(chunk: int, offset: torch.Tensor, device):
    size = torch.tensor(chunk, device=device)

    def chunk_mod(b, h, q_idx, kv_idx):
        return torch.div(q_idx + offset, size, rounding_mode="floor") == torch.div(kv_idx, size, rounding_mode="floor")

    return chunk_mod


def restriction_mod(fa, causal: str, attn_mask, shapes, device, *, window=None, chunk=None):
    """The mask_mod of every restriction on the keys and the batch and head sizes its block mask needs,
    or (None, None, None) when every key is visible."""
    mods, B, H = [], None, None
    offset = torch.tensor(shapes.n_k - shapes.n_q, device=device)  # bottom-right alignment
    if causal != "none":
        mods.append(_causal_mod(offset if causal == "bottom_right" else torch.tensor(0, device=device)))
    if window is not None:
        mods.append(_window_mod(window, offset, device))
    if chunk is not None:
        mods.append(_chunk_mod(chunk, offset, device))
    if attn_mask is not None:
        mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        mods.append(from_tensor(mask))
        # Size-1 batch/head dimensions of the mask broadcast: the block mask need not repeat them.
        B = shapes.batch if mask.shape[0] > 1 else None
        H = shapes.heads_q if mask.shape[1] > 1 else None
    if not mods:
        return None, None, None  # flex's default: every key visible
    return (mods[0] if len(mods) == 1 else fa.and_masks(*mods)), B, H


def _score_mod(shapes, device, *, softcap=None, alibi_slopes=None, attn_bias=None, alibi="symmetric"):
    """flex's ``score_mod`` for the cap, then ALiBi (of the ``alibi`` mode) and the bias (``bias_order="cap_first"``),
    or None.

    Every value is a captured tensor (the cap a 0-d one), so a new value is no recompile; the slopes
    and the bias are broadcast views of the full (B, Hq) and (B, Hq, Nq, Nk), read at [b, h, ...]."""
    cap = torch.tensor(softcap, dtype=torch.float32, device=device) if softcap not in (None, math.inf) else None
    full = (shapes.batch, shapes.heads_q, shapes.n_q, shapes.n_k)
    slopes = None if alibi_slopes is None else alibi_slopes.to(device, torch.float32).expand(full[:2])
    bias = None if attn_bias is None else attn_bias.to(device).expand(full)
    if cap is None and slopes is None and bias is None:
        return None
    offset = torch.tensor(shapes.n_k - shapes.n_q, device=device)
    linear = alibi == "linear"

    def score_mod(score, b, h, q_idx, kv_idx):
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        if slopes is not None and linear:  # slope (j - i), top-left
            score = score + slopes[b, h] * (kv_idx - q_idx)
        elif slopes is not None:  # flash-attention's symmetric ALiBi, bottom-right aligned
            score = score - slopes[b, h] * (q_idx + offset - kv_idx).abs()
        if bias is not None:  # -inf hides the key: flex gives a row with no finite score 0 and lse -inf
            score = score + bias[b, h, q_idx, kv_idx]
        return score

    return score_mod


def flex_sink_key(k, v, mask_mod, score_mod, sinks):
    """K and V with one more key, of zero K and V, and the mods that give it each head's sink as its score
    and show it to every query: flex then adds e^sink to each row's sum and nothing to its numerator, so
    the output is rounded once and the lse includes the sink. The given mods index tensors of Nk keys:
    they see the sink key as key Nk - 1, and are overruled there. Torch only: a reproducer script copies it."""
    last = torch.tensor(k.shape[2], device=k.device)
    sink = sinks.to(k.device, torch.float32)
    clamp = lambda kv_idx: torch.minimum(kv_idx, last - 1)  # noqa: E731

    def sink_mask(b, h, q_idx, kv_idx):
        return (kv_idx == last) | mask_mod(b, h, q_idx, clamp(kv_idx))

    def sink_score(score, b, h, q_idx, kv_idx):
        score = score if score_mod is None else score_mod(score, b, h, q_idx, clamp(kv_idx))
        return torch.where(kv_idx == last, sink[h], score)

    zero = lambda t: torch.cat([t, t.new_zeros(t.shape[:2] + (1, t.shape[3]))], dim=2)  # noqa: E731
    return zero(k), zero(v), (None if mask_mod is None else sink_mask), sink_score


def _unsupported(exc: BaseException) -> str | None:
    """The 'not implemented' line of a flex/inductor failure, if that is what it is."""
    if isinstance(exc, NotImplementedError):
        return str(exc).strip() or type(exc).__name__
    for line in f"{type(exc).__name__}: {exc}".splitlines():
        if "NotImplementedError" in line or "NYI" in line:
            return line.strip()
    return None


def flex_heads(q, k, v, shapes, masked_cuda: bool):
    """K, V and whether flex's enable_gqa is used."""
    gqa = shapes.heads_q != shapes.heads_kv
    if gqa and masked_cuda:
        # Measured (torch 2.11, H200): enable_gqa with a mask_mod that captures tensors makes
        # inductor's flex-decoding path (Nq < 128) fail to compile (NoValidChoicesError). Repeating
        # K/V over the query heads computes the same per-head attention through the main kernel.
        return k.repeat_interleave(shapes.group, dim=1), v.repeat_interleave(shapes.group, dim=1), False
    return k, v, gqa


def flex_options(fa, scale: float, gqa: bool, returns_lse: bool) -> dict:
    kwargs = {"scale": scale, "enable_gqa": gqa}
    if returns_lse:
        aux_request = getattr(fa, "AuxRequest", None)
        if aux_request is not None:
            kwargs["return_aux"] = aux_request(lse=True)
        else:  # torch < 2.9
            kwargs["return_lse"] = True
    return kwargs


def run_flex(fn, q, mods, kwargs):
    """``fn`` on q and the keys, values, block mask and score_mod of ``mods()``; flex's 'not implemented' as
    Unsupported."""
    with warnings.catch_warnings():
        # Eager flex warns that it is unfused: that is what compile=False asks for.
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        warnings.filterwarnings("ignore", message=".*return_lse is deprecated")
        try:
            with torch.no_grad(), _dynamo_patch():
                return fn(q, **mods(), **kwargs)
        except Exception as exc:
            reason = _unsupported(exc)
            if reason is None:
                raise
            raise Unsupported(f"FlexAttention: {reason}") from exc


def flex_outputs(result, returns_lse: bool):
    """``out``, or ``(out, lse)`` where flex returned its lse (an aux record since torch 2.9)."""
    if not returns_lse:
        return result
    out, aux = result
    return out, getattr(aux, "lse", aux)


def make_flex_kernel(*, device: str = "cuda", compile: bool = True, alibi: str = "symmetric") -> Kernel:
    """FlexAttention as a kernel for ``device`` (``"cuda"`` or ``"cpu"``).

    ``compile=True`` (default) tests the fused kernel torch.compile generates; ``compile=False`` the
    unfused eager path. Returns ``(out, lse)``, or ``out`` alone for the compiled CPU kernel. ``alibi``: the
    ALiBi the score_mod adds, ``"symmetric"`` (flash-attention's) or ``"linear"`` (attention-gym's slope (j - i)).
    """
    if alibi not in ALIBI_MODES:
        raise InvalidArgument("alibi", alibi, "unknown ALiBi mode", f"Use one of {list(ALIBI_MODES)}.")
    check_available(device, compile)
    returns_lse = not (compile and device == "cpu")
    spec = KernelSpec(
        dtypes=DTYPES, causal=CAUSAL_MODES, attn_mask=True, gqa=True,
        # The compiled CUDA kernel refuses D or Dv below 16 ("NYI: embedding dimension ... at least 16").
        min_head_dim=16 if (compile and device == "cuda") else 1, max_head_dim=256, dv_equals_d=False,
        fully_masked_rows="zero", precision="flash", devices=(device,),
        nan_safe_masking=False,  # partly masked blocks still load every V row: 0 * NaN = NaN
        softcap=True, alibi=alibi, attn_bias=True, fp32_bias=True, bias_order="cap_first",
        window=True, chunk=True, sinks=True,
    )

    def attention(q, k, v, *, scale, causal="none", attn_mask=None, window=None, chunk=None, sinks=None,
                  **scores):
        q, k, v, scale, causal, attn_mask, shapes = validated_call(
            NAME, device, q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
        fa = flex_module()
        captures = causal != "none" or attn_mask is not None or any(x is not None for x in (window, chunk, sinks))
        k, v, gqa = flex_heads(q, k, v, shapes, compile and device == "cuda" and (captures or bool(scores)))
        fn = compiled_flex(fa, device) if compile else fa.flex_attention

        def mods():
            mask_mod, B, H = restriction_mod(fa, causal, attn_mask, shapes, q.device, window=window, chunk=chunk)
            score_mod = _score_mod(shapes, q.device, alibi=alibi, **scores)
            k_, v_ = k, v
            if sinks is not None:
                k_, v_, mask_mod, score_mod = flex_sink_key(k, v, mask_mod, score_mod, sinks)
            block_mask = None if mask_mod is None else fa.create_block_mask(mask_mod, B, H, shapes.n_q, k_.shape[2],
                                                                             device=q.device)
            return dict(key=k_, value=v_, block_mask=block_mask, score_mod=score_mod)

        return flex_outputs(run_flex(fn, q, mods, flex_options(fa, scale, gqa, returns_lse)), returns_lse)

    attention.__name__ = attention.__qualname__ = "flex"
    attention.__doc__ = DESCRIPTION
    options = ([] if compile else ["compile=False"]) + ([] if alibi == "symmetric" else [f"alibi={alibi}"])
    name = f"{NAME}[{','.join(options)}]" if options else NAME
    return Kernel(attention, spec, name=name)
