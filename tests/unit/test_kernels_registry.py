"""The kernel registry: built-in names, import paths, callables, options, devices and refusals."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import flashcheck
from flashcheck import BackendUnavailable, InvalidArgument, Kernel
from flashcheck.contract.spec import DEFAULT_SPEC
from flashcheck.kernels.registry import BUILTIN_KERNELS, available_kernels, resolve_kernel

from . import _kernels_fixture as fixture

HAS_CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None
FIXTURE = "tests.unit._kernels_fixture"
CUDA_ONLY_ON_CPU = ("torch:efficient", "torch:cudnn")


def test_builtin_names_and_descriptions():
    assert list(BUILTIN_KERNELS) == ["torch:math", "torch:flash", "torch:efficient", "torch:cudnn", "torch:flex",
                                     "flashcheck:triton", "fla:parallel_attn", "fla:parallel_attn-varlen",
                                     "fla:attn_decoding", "sglang:mla-decode", "sage:sageattn", "sage:sageattn-varlen",
                                     "torch:varlen", "torch:paged", "torch:jagged", "torch:split-kv",
                                     "torch:flex-varlen", "flashcheck:triton-varlen", "flashcheck:triton-paged",
                                     "flashcheck:triton-split-kv", "torch:fp8", "flashcheck:triton-fp8",
                                     "torch:fp8-kv-token", "torch:fp8-kv-blocks", "torch:fp8-kv-tensor", "torch:mxfp8",
                                     "torch:nvfp4",
                                     "flashcheck:triton-fp8-kv-blocks", "torch:int8-qk", "torch:mla", "torch:mla-paged",
                                     "torch:mla-fp8", "flashcheck:triton-mla", "torch:sparse", "torch:sparse-varlen",
                                     "torch:sparse-paged", "torch:mla-sparse", "flashcheck:triton-sparse",
                                     "torch:block-sparse", "torch:flex-block-sparse",
                                     "flashcheck:triton-block-sparse"]
    for name, description in BUILTIN_KERNELS.items():
        assert isinstance(description, str) and description and "\n" not in description, name


# ------------------------------------------------------------------------------------------------
# Built-in names, per device
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["torch:math", "torch:flash", "torch:flex", "flashcheck:triton"])
def test_cpu_builtins_resolve(name):
    if name == "flashcheck:triton" and not HAS_TRITON:
        pytest.skip("triton is not installed")
    kernel = resolve_kernel(name, device="cpu")
    assert isinstance(kernel, Kernel)
    assert kernel.name.startswith(name)
    assert kernel.spec.devices == ("cpu",)


@pytest.mark.parametrize("name", CUDA_ONLY_ON_CPU)
def test_cuda_only_backends_refuse_the_cpu(name):
    with pytest.raises(BackendUnavailable) as info:
        resolve_kernel(name, device="cpu")
    err = info.value
    assert (err.backend, err.device) == (name, "cpu")
    assert "no CPU implementation" in err.reason
    assert name in str(err) and "'cpu'" in str(err) and err.reason in str(err)


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("name", list(BUILTIN_KERNELS))
def test_every_builtin_refuses_cuda_without_a_gpu(name):
    with pytest.raises(BackendUnavailable) as info:
        resolve_kernel(name, device="cuda")
    err = info.value
    assert (err.backend, err.device) == (name, "cuda")
    assert err.reason == "no CUDA device is visible (torch.cuda.is_available() is False)"
    message = str(err)
    assert name in message and "'cuda'" in message and err.reason in message
    assert "--device cpu" in message  # says what to do instead


def test_available_kernels():
    cpu = available_kernels("cpu")
    assert {"torch:math", "torch:flash"} <= set(cpu)
    assert not set(cpu) & set(CUDA_ONLY_ON_CPU)
    assert ("flashcheck:triton" in cpu) == HAS_TRITON
    assert set(cpu) <= set(BUILTIN_KERNELS)
    if not HAS_CUDA:
        assert available_kernels("cuda") == ()
    with pytest.raises(InvalidArgument, match="device"):
        available_kernels("tpu")


def test_available_kernels_changes_nothing(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    available_kernels("cpu")
    assert "TRITON_INTERPRET" not in os.environ


@pytest.mark.parametrize("device", ["mps", "tpu", 0, None])  # no id "gpu": the root conftest skips that keyword
def test_bad_device_is_refused_by_name(device):
    with pytest.raises(InvalidArgument) as info:
        resolve_kernel("torch:math", device=device)
    assert info.value.argument == "device"
    assert "'cuda'" in str(info.value) and "'cpu'" in str(info.value)


def test_device_with_an_index_is_accepted():
    assert resolve_kernel("torch:math", device=torch.device("cpu")).spec.devices == ("cpu",)


# ------------------------------------------------------------------------------------------------
# Unknown names, import paths, callables
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["torch:flash2", "flashcheck:cuda", "math", "torch", "", "a b:c"])
def test_unknown_names_list_the_builtins(target):
    with pytest.raises(InvalidArgument) as info:
        resolve_kernel(target, device="cpu")
    message = str(info.value)
    assert info.value.argument == "kernel"
    for name in BUILTIN_KERNELS:
        assert name in message


def test_import_path_to_a_decorated_kernel():
    kernel = resolve_kernel(f"{FIXTURE}:decorated", device="cpu")
    assert kernel is fixture.decorated
    assert kernel.name == "fixture:decorated"
    assert kernel.spec.dtypes == ("fp32",) and kernel.spec.precision.name == "strict"


def test_import_path_to_a_plain_callable_gets_the_default_spec():
    kernel = resolve_kernel(f"{FIXTURE}:plain", device="cpu")
    assert isinstance(kernel, Kernel) and kernel.fn is fixture.plain
    assert kernel.spec == DEFAULT_SPEC
    assert kernel.name == f"{FIXTURE}:plain"
    q = torch.randn(1, 2, 5, 8)
    out = kernel(q, q, q, scale=0.5, causal="top_left")
    assert out.shape == q.shape


def test_import_path_with_a_dotted_attribute():
    kernel = resolve_kernel(f"{FIXTURE}:Namespace.attention", device="cpu")
    assert kernel.fn is fixture.plain


def test_import_path_missing_module_says_module():
    with pytest.raises(InvalidArgument) as info:
        resolve_kernel("tests.unit._no_such_module:attention", device="cpu")
    message = str(info.value)
    assert "module 'tests.unit._no_such_module' not found" in message
    assert "before the colon" in message


def test_import_path_missing_top_level_package_says_which():
    with pytest.raises(InvalidArgument, match=r"no module named 'nosuchpkg_flashcheck'"):
        resolve_kernel("nosuchpkg_flashcheck.sub:attention", device="cpu")


def test_import_path_missing_attribute_says_attribute():
    with pytest.raises(InvalidArgument) as info:
        resolve_kernel(f"{FIXTURE}:missing", device="cpu")
    message = str(info.value)
    assert "attribute 'missing' was not found" in message and "after the colon" in message
    assert "decorated" in message and "plain" in message  # what the module does have
    with pytest.raises(InvalidArgument, match="attribute 'nope' was not found in '.*:Namespace'"):
        resolve_kernel(f"{FIXTURE}:Namespace.nope", device="cpu")


def test_import_path_to_a_non_callable():
    with pytest.raises(InvalidArgument, match="'NOT_CALLABLE' is a int, not a callable"):
        resolve_kernel(f"{FIXTURE}:NOT_CALLABLE", device="cpu")


def test_import_path_to_a_kernel_for_another_device():
    with pytest.raises(BackendUnavailable) as info:
        resolve_kernel(f"{FIXTURE}:decorated", device="cuda")
    assert info.value.backend == "fixture:decorated" and info.value.device == "cuda"
    assert "('cpu',)" in info.value.reason


def test_callables_and_kernels_passed_directly():
    assert resolve_kernel(fixture.decorated, device="cpu") is fixture.decorated
    kernel = resolve_kernel(fixture.plain, device="cuda")
    assert kernel.fn is fixture.plain and kernel.spec == DEFAULT_SPEC
    with pytest.raises(InvalidArgument, match="expected a kernel name"):
        resolve_kernel(42, device="cpu")


# ------------------------------------------------------------------------------------------------
# Options
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["torch:math", "torch:flash", "torch:efficient", "torch:cudnn"])
def test_sdpa_kernels_take_no_options(name):
    # Checked before availability: a usage error is reported as such on any machine.
    with pytest.raises(InvalidArgument) as info:
        resolve_kernel(name, device="cpu", block_m=64)
    assert info.value.argument == "block_m"
    assert f"not an option of kernel {name!r}" in str(info.value) and "takes no options" in str(info.value)


def test_flex_options():
    assert resolve_kernel("torch:flex", device="cpu", compile=False).name == "torch:flex[compile=False]"
    with pytest.raises(InvalidArgument) as info:
        resolve_kernel("torch:flex", device="cpu", mode="max-autotune")
    assert info.value.argument == "mode" and "compile" in str(info.value)
    with pytest.raises(InvalidArgument, match="compile"):
        resolve_kernel("torch:flex", device="cpu", compile="yes")


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_options_pass_through():
    kernel = resolve_kernel("flashcheck:triton", device="cpu", block_m=32, block_n=16, input_precision="ieee")
    assert "block_m=32" in kernel.name and "block_n=16" in kernel.name
    assert kernel.spec.precision.name == "strict" and kernel.spec.devices == ("cpu",)
    with pytest.raises(InvalidArgument) as info:
        resolve_kernel("flashcheck:triton", device="cpu", tile=64)
    assert info.value.argument == "tile" and "block_m" in str(info.value)
    with pytest.raises(InvalidArgument, match="block_m"):
        resolve_kernel("flashcheck:triton", device="cpu", block_m=48)


def test_options_for_an_import_path_are_refused():
    with pytest.raises(InvalidArgument) as info:
        resolve_kernel(f"{FIXTURE}:plain", device="cpu", block_m=64)
    assert info.value.argument == "block_m" and "built-in kernels only" in str(info.value)


# ------------------------------------------------------------------------------------------------
# flashcheck:triton and TRITON_INTERPRET
# ------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_cpu_triton_turns_the_interpreter_on(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    resolve_kernel("flashcheck:triton", device="cpu")
    assert os.environ["TRITON_INTERPRET"] == "1"


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_cpu_triton_refused_once_jitted_for_the_gpu(monkeypatch):
    from flashcheck.kernels.triton import forward as triton_flash

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(triton_flash, "_JITTED", {"interpreted": False})  # as after a compiled-mode jit
    with pytest.raises(BackendUnavailable) as info:
        resolve_kernel("flashcheck:triton", device="cpu")
    err = info.value
    assert (err.backend, err.device) == ("flashcheck:triton", "cpu")
    assert "TRITON_INTERPRET=1 before importing triton" in str(err) and "--device cpu" in str(err)
    assert "TRITON_INTERPRET" not in os.environ


def test_triton_not_installed(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    with pytest.raises(BackendUnavailable) as info:
        resolve_kernel("flashcheck:triton", device="cpu")
    assert info.value.reason == "triton is not installed" and "flashcheck[cpu]" in str(info.value)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_gpu_triton_refused_under_the_interpreter(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # pretend: the check comes first
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(BackendUnavailable) as info:
        resolve_kernel("flashcheck:triton", device="cuda")
    assert info.value.device == "cuda" and "TRITON_INTERPRET=1 is set" in info.value.reason


# ------------------------------------------------------------------------------------------------
# Call-time refusals and imports
# ------------------------------------------------------------------------------------------------


def test_forced_backend_refusal_at_call_time_carries_torchs_reason():
    kernel = resolve_kernel("torch:flash", device="cpu")
    q, k = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 6, 16)
    v = torch.randn(1, 2, 6, 8)  # Dv != D: the CPU flash kernel refuses
    with pytest.raises(flashcheck.Unsupported) as info:  # the input, not the backend: check() skips it
        kernel(q, k, v, scale=0.25, causal="none")
    err = info.value
    assert err.reason.startswith("Flash attention requires q,k,v to have the same last dimension")
    assert "Value.size(-1): 8" in err.reason  # torch's words, without its "Triggered internally" suffix
    assert "Triggered internally" not in err.reason
    assert isinstance(err.__cause__, RuntimeError)


def test_importing_flashcheck_does_not_import_triton():
    """Nor does listing the kernels with their planted bugs: where triton is missing they are listed all the same."""
    code = ("import contextlib, io, sys, flashcheck, flashcheck.kernels, flashcheck.kernels.sdpa, flashcheck.kernels.flex\n"
            "from flashcheck.cli import main\n"
            "flashcheck.kernels.resolve_kernel('torch:math', device='cpu')\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    assert main(['kernels']) == 0\n"
            "assert 'triton' not in sys.modules, 'triton was imported'")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)


def test_public_api():
    import flashcheck.kernels as kernels

    assert set(kernels.__all__) == {"BUILTIN_KERNELS", "DEVICES", "available_kernels", "resolve_kernel"}
    assert flashcheck.Kernel is Kernel


def test_fla_decoding_is_refused_on_the_cpu_and_says_why():
    with pytest.raises(BackendUnavailable, match="no driver"):
        resolve_kernel("fla:attn_decoding", device="cpu")

