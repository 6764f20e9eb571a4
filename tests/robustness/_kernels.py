"""Planted kernels for the robustness tests, importable as tests.robustness._kernels:NAME.

Each misbehaves in one way a real kernel can: kills its process, hangs, runs out of device memory,
poisons its CUDA context, returns the wrong shape or dtype, or is merely slow. Most misbehave only on
cases with more than ``BIG`` query rows, so that a campaign meets good and bad cases and must go on.
"""

import os
import signal
import subprocess
import sys
import time

import torch

import flashcheck
from flashcheck.numerics.twin import Tiling, twin_attention
from tests._planted import wrong_scale_past

SPEC = dict(causal=("none", "top_left", "bottom_right"), attn_mask=True, gqa=True, dv_equals_d=False,
            fully_masked_rows="zero", precision="flash")
BIG = 16  # query rows above which the misbehaving kernels misbehave


def _attention(q, k, v, *, scale, causal, attn_mask=None):
    return twin_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, tiling=Tiling(32, 32))


def _big(q) -> bool:
    return q.shape[2] > BIG


@flashcheck.kernel(**SPEC)
def correct(q, k, v, *, scale, causal, attn_mask=None):
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def exits(q, k, v, *, scale, causal, attn_mask=None):
    """Leaves the process with exit code 3 on big cases (a kernel calling exit, an abort handler)."""
    if _big(q):
        os._exit(3)
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def segfaults(q, k, v, *, scale, causal, attn_mask=None):
    """Dies of SIGSEGV on big cases, as a kernel writing out of bounds does."""
    if _big(q):
        os.kill(os.getpid(), signal.SIGSEGV)
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def hangs(q, k, v, *, scale, causal, attn_mask=None):
    """Never returns on big cases (a kernel spinning on a flag no one sets)."""
    if _big(q):
        while True:
            time.sleep(1)
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def stalls(q, k, v, *, scale, causal, attn_mask=None):
    """Takes a minute on every call, as a first compile of a large kernel can."""
    time.sleep(60)
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def out_of_memory(q, k, v, *, scale, causal, attn_mask=None):
    """Runs out of device memory on big cases (raised by hand: the CPU has no CUDA allocator)."""
    if _big(q):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def cuda_out_of_memory(q, k, v, *, scale, causal, attn_mask=None):
    """Runs out of device memory outside the caching allocator on big cases: CUDA's own error, as a cuBLAS
    workspace on a full GPU raised it (torch.AcceleratorError, raised by hand)."""
    if _big(q):
        raise torch.AcceleratorError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported")
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def oom_on_rerun(q, k, v, *, scale, causal, attn_mask=None):
    """Runs out of device memory on a non-contiguous q: the layout property's rerun, not the first run."""
    if not q.is_contiguous():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def poisons_cuda(q, k, v, *, scale, causal, attn_mask=None):
    """Raises what an illegal memory access raises on big cases, and remembers it: like a real poisoned
    CUDA context, every later call in the same process fails too."""
    if _big(q) or os.environ.get("_PLANTED_POISONED") == str(os.getpid()):
        os.environ["_PLANTED_POISONED"] = str(os.getpid())
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


class _BrokenContext(torch.Tensor):
    """An output whose every use raises what CUDA raises once a kernel broke the context: the error of
    an asynchronous launch surfaces at a later call, here in flashcheck's own code."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


@flashcheck.kernel(**SPEC)
def poisons_cuda_later(q, k, v, *, scale, causal, attn_mask=None):
    """Returns normally on big cases, but whatever touches the output next fails (see _BrokenContext)."""
    out, lse = _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    return (out.as_subclass(_BrokenContext), lse) if _big(q) else (out, lse)


@flashcheck.kernel(**SPEC)
def wrong_shape(q, k, v, *, scale, causal, attn_mask=None):
    """Drops the last query row on big cases."""
    out, lse = _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    return (out[:, :, :-1], lse[:, :, :-1]) if _big(q) else (out, lse)


@flashcheck.kernel(**SPEC)
def wrong_dtype(q, k, v, *, scale, causal, attn_mask=None):
    """Returns fp32 output for fp16 input on big cases."""
    out, lse = _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    return (out.float(), lse) if _big(q) else (out, lse)


@flashcheck.kernel(**SPEC)
def two_bugs(q, k, v, *, scale, causal, attn_mask=None):
    """Crashes on big cases, and is off by far (a wrong scale) on rows past 8 of the others."""
    if _big(q):
        raise IndexError("tile index out of range")
    out, lse = _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    return wrong_scale_past(out, 8, 1.25, q, k, v, scale=scale, causal=causal, attn_mask=attn_mask), lse


CALLS_FILE = "FLASHCHECK_TEST_CALLS"  # environment variable: a file the slow kernels add a line to per call


def _slow_call() -> None:
    time.sleep(0.2)
    if os.environ.get(CALLS_FILE):  # lets a test see the campaign at work from outside
        with open(os.environ[CALLS_FILE], "a") as fh:
            fh.write(".\n")


@flashcheck.kernel(**SPEC)
def slow(q, k, v, *, scale, causal, attn_mask=None):
    """Correct, but sleeps 0.2 s per call: a campaign that is still running when it is interrupted."""
    _slow_call()
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def slow_bug(q, k, v, *, scale, causal, attn_mask=None):
    """Sleeps 0.2 s per call and crashes on big cases: a bug is found before the interruption."""
    _slow_call()
    if _big(q):
        raise IndexError("tile index out of range")
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


GATE_FILE = "FLASHCHECK_TEST_GATE"  # environment variable: while the file it names exists, the gated kernel waits


@flashcheck.kernel(**SPEC)
def gated_crash(q, k, v, *, scale, causal, attn_mask=None):
    """Crashes on big cases at once; any other call first waits while the gate file exists: a test holds the
    campaign mid-run (every worker in a kernel call), and lets it go on."""
    if _big(q):
        raise IndexError("tile index out of range")
    gate = os.environ.get(GATE_FILE)
    while gate and os.path.exists(gate):
        time.sleep(0.05)
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def odd_keys_unsupported(q, k, v, *, scale, causal, attn_mask=None):
    """Declines an odd number of keys, a limit its spec cannot express: such cases are skipped, not failed."""
    if k.shape[2] % 2:
        raise flashcheck.Unsupported(f"an odd number of keys ({k.shape[2]})")
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def strided_q_unsupported(q, k, v, *, scale, causal, attn_mask=None):
    """Declines a non-contiguous q: only the layout property's rerun meets it."""
    if not q.is_contiguous():
        raise flashcheck.Unsupported(reason="q must be contiguous")
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def raises_value_error(q, k, v, *, scale, causal, attn_mask=None):
    """Raises an ordinary exception on odd key counts: a crash, unlike Unsupported."""
    if k.shape[2] % 2:
        raise ValueError(f"cannot handle {k.shape[2]} keys")
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def reports_triton_cache_dir(q, k, v, *, scale, causal, attn_mask=None):
    """Declines every input, giving its process's TRITON_CACHE_DIR as the reason: what a worker inherited."""
    raise flashcheck.Unsupported(os.environ.get("TRITON_CACHE_DIR", "unset"))


# Differentiable kernels for the backward pass: an fp32 softmax attention through autograd.
def autograd_attention(q, k, v, scale, on_dq=None):
    q32, k32, v32 = q.float(), k.float(), v.float()
    if on_dq is not None and q32.requires_grad:
        q32.register_hook(on_dq)
    p = torch.softmax((q32 @ k32.transpose(-1, -2)) * scale, -1)
    return (p @ v32).to(q.dtype)


BACKWARD_SPEC = dict(causal=("none",), dtypes=("fp16", "fp32"), precision="upcast", backward=True)


@flashcheck.kernel(**BACKWARD_SPEC)
def differentiable(q, k, v, *, scale, causal, attn_mask=None):
    return autograd_attention(q, k, v, scale)


@flashcheck.kernel(**BACKWARD_SPEC)
def dq_unscaled(q, k, v, *, scale, causal, attn_mask=None):
    """The forward is right; dQ misses the softmax scale on cases with more than BIG query rows."""
    return autograd_attention(q, k, v, scale, on_dq=(lambda g: g / scale) if _big(q) else None)


def _out_of_memory(grad):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")


@flashcheck.kernel(**BACKWARD_SPEC)
def backward_out_of_memory(q, k, v, *, scale, causal, attn_mask=None):
    """The forward runs; the backward runs out of device memory on big cases (raised by hand, as above)."""
    return autograd_attention(q, k, v, scale, on_dq=_out_of_memory if _big(q) else None)


def _segfault(grad):
    os.kill(os.getpid(), signal.SIGSEGV)


@flashcheck.kernel(**BACKWARD_SPEC)
def segfaults_in_backward(q, k, v, *, scale, causal, attn_mask=None):
    """The forward runs; its backward dies of SIGSEGV on big cases, in autograd, after the kernel's call returned."""
    return autograd_attention(q, k, v, scale, on_dq=_segfault if _big(q) else None)


def _as_if_contiguous(t):
    """``t`` read the way a kernel that ignores strides reads it: contiguous from its first element."""
    strides = (t.shape[1] * t.shape[2] * t.shape[3], t.shape[2] * t.shape[3], t.shape[3], 1)
    return t.as_strided(t.shape, strides, t.storage_offset())


@flashcheck.kernel(**SPEC)
def assumes_contiguous(q, k, v, *, scale, causal, attn_mask=None):
    """Two defects: it ignores strides (wrong numbers, or a crash, on transposed, strided and stride-0
    views), and its scale is off on rows past 8 (a numerical defect in every layout)."""
    q, k, v = (_as_if_contiguous(t) for t in (q, k, v))
    out, lse = _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    return wrong_scale_past(out, 8, 1.25, q, k, v, scale=scale, causal=causal, attn_mask=attn_mask), lse


# A compiler the kernel runs (Triton's ptxas, Inductor's g++) that handles SIGINT itself, as ptxas does: it dies
# of a Ctrl-C that reaches it even where its parent ignores SIGINT. It says "started" in the calls file first.
_COMPILER = ("import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_DFL); "
             "open(sys.argv[1], 'a').write('started\\n'); time.sleep(0.4)")


@flashcheck.kernel(**SPEC)
def compiles(q, k, v, *, scale, causal, attn_mask=None):
    """Correct, but each call first waits for a child process that a Ctrl-C would kill; the child's exit
    status goes to the calls file (-2: killed by SIGINT)."""
    calls = os.environ.get(CALLS_FILE) or os.devnull
    status = subprocess.run([sys.executable, "-c", _COMPILER, calls]).returncode
    with open(calls, "a") as fh:
        fh.write(f"{status}\n")
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
