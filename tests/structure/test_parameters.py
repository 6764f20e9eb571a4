"""No function takes more than 10 parameters: what travels together is a record (a frozen dataclass such as
``CampaignConfig``), passed whole, not a long keyword list repeated at every call site. Read from the source
(ast); ``self`` and ``cls`` are not counted, ``*args`` and ``**kwargs`` count one each.

Exempt: the Triton kernels (``@triton.jit`` functions, and those of the kernel sources jitted when Triton is
first imported), whose arguments are what the kernel reads, and their launchers, which pass them on; and
the known exceptions below, each with why it stays for now. An exception that no longer exceeds the limit
must leave the list, so that the list always names what is left.
"""

from __future__ import annotations

import ast

import pytest

from ._imports import modules

MAX_PARAMETERS = 10
MODULES = modules()

# The Triton kernels jitted by their module's _load() (Triton is imported on first use, so no decorator), and
# the launchers that pass a kernel its arguments.
TRITON_KERNELS = {
    "kernels.triton.forward:_flash_attention_fwd": "the forward kernel, jitted by _load()",
    "kernels.triton.backward:_visible_py": "a device function of the backward kernels, jitted by _load()",
    "kernels.triton.backward:_biases_py": "a device function of the backward kernels, jitted by _load()",
    "kernels.triton.backward:_p_and_ds_py": "a device function of the backward kernels, jitted by _load()",
    "kernels.triton.backward:_dkdv_kernel": "the dK/dV kernel, jitted by _load()",
    "kernels.triton.backward:_dq_kernel": "the dQ kernel, jitted by _load()",
    "kernels.triton.forward:triton_attention": "the forward kernel's launcher",
    "kernels.triton.forward:_Differentiable.forward": "autograd's forward of the launcher: its inputs one by one",
    "kernels.triton.backward:triton_attention_backward": "the backward kernels' launcher",
}

_CALLING_CONVENTION = ("a kernel callable: q, k, v and the keywords of the calling convention "
                       "(flashcheck.contract.validation), one parameter each")
KNOWN_EXCEPTIONS = {
    "kernels.triton.forward:make_kernel.attention": _CALLING_CONVENTION,
    "kernels.triton.fp8_kv_blocks:make_fp8_kv_blocks_kernel.attention": _CALLING_CONVENTION + ", its three descales "
                                                                          "and K's and V's block scales among them",
}


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    named = [x.arg for x in a.posonlyargs + a.args]
    count = len(named) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return count - (bool(named) and named[0] in ("self", "cls"))


def _jitted(node) -> bool:
    """Decorated ``@triton.jit`` or ``@triton.jit(...)``."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "jit" and \
                isinstance(target.value, ast.Name) and target.value.id == "triton":
            return True
    return False


def functions(source: str, module: str) -> dict[str, tuple[int, bool]]:
    """``module:qualified.name`` -> (its parameters, whether it is a ``@triton.jit`` kernel)."""
    found = {}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                found[f"{module}:{name}"] = (_parameters(child), _jitted(child))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def _all_functions() -> dict[str, tuple[int, bool]]:
    found = {}
    for module, path in MODULES.items():
        found.update(functions(path.read_text(), module))
    return found


FUNCTIONS = _all_functions()


def too_many(found: dict) -> list[str]:
    """The functions over the limit that no rule exempts."""
    return [f"{name} ({n} parameters)" for name, (n, jitted) in sorted(found.items())
            if n > MAX_PARAMETERS and not jitted and name not in TRITON_KERNELS and name not in KNOWN_EXCEPTIONS]


def test_no_function_takes_more_than_10_parameters():
    found = too_many(FUNCTIONS)
    assert not found, (f"{found}: pass a record (a frozen dataclass) instead of a long list of keywords; "
                       "tests/structure/test_parameters.py says which exceptions there are and why")


@pytest.mark.parametrize("name", sorted(set(KNOWN_EXCEPTIONS) | set(TRITON_KERNELS)))
def test_every_exception_still_names_a_function_over_the_limit(name):
    assert name in FUNCTIONS, f"{name} is gone: remove it from the exceptions"
    assert FUNCTIONS[name][0] > MAX_PARAMETERS, f"{name} takes {FUNCTIONS[name][0]} parameters now: remove it"


def test_the_count_and_the_exemptions_read_the_source():
    source = """
class C:
    def method(self, a, b, c, d, e, f, g, h, i, j):
        def inner(*args, k, l, m, n, o, p, q, r, s, t, **kwargs):
            pass

@triton.jit(do_not_specialize=())
def kernel(a, b, c, d, e, f, g, h, i, j, k):
    pass

def wide(a, /, b, c, d, e, f, g, h, i, j, *, k):
    pass
"""
    found = functions(source, "m")
    assert found == {"m:C.method": (10, False), "m:C.method.inner": (12, False), "m:kernel": (11, True),
                     "m:wide": (11, False)}
    assert too_many(found) == ["m:C.method.inner (12 parameters)", "m:wide (11 parameters)"]
