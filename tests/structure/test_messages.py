"""Every message between processes is a dataclass of one module, ``flashcheck.campaign.messages``, and goes
through a ``Channel`` (``flashcheck.campaign.transport``), which refuses anything else: no tuple read by index,
no kind spelled as a string, no pipe used by hand elsewhere."""

from __future__ import annotations

import ast
import dataclasses
import pickle

import pytest

from flashcheck.campaign import messages
from flashcheck.campaign.transport import channel_pair

from ._imports import modules

MODULES_WITH_SOURCE = {module: path.read_text() for module, path in modules().items()}
MESSAGE_MODULE = "campaign.messages"
TRANSPORT_MODULE = "campaign.transport"
# What only the transport may call: the pipe itself and its raw reads and writes.
RAW_PIPE = {"Pipe", "send_bytes", "recv_bytes", "recv"}
MESSAGE_CLASSES = [c for c in vars(messages).values()
                   if isinstance(c, type) and issubclass(c, messages.Message) and c is not messages.Message]


def _message_classes_outside(module: str, tree: ast.AST) -> list[str]:
    """Classes of ``module`` that derive from ``Message``."""
    return [f"{module}:{node.name}" for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any((isinstance(b, ast.Name) and b.id == "Message") or (isinstance(b, ast.Attribute) and
                                                                      b.attr == "Message") for b in node.bases)]


def raw_pipe_calls(tree: ast.AST) -> list[str]:
    return [f"line {node.lineno}: {node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id}()"
            for node in ast.walk(tree) if isinstance(node, ast.Call) and (
                (isinstance(node.func, ast.Attribute) and node.func.attr in RAW_PIPE)
                or (isinstance(node.func, ast.Name) and node.func.id in RAW_PIPE))]


def test_message_classes_live_in_one_module():
    found = [name for module, source in MODULES_WITH_SOURCE.items() if module != MESSAGE_MODULE
             for name in _message_classes_outside(module, ast.parse(source))]
    assert not found, f"message classes outside flashcheck/{MESSAGE_MODULE.replace('.', '/')}.py: {found}"


def test_only_the_transport_uses_a_pipe_by_hand():
    found = {module: calls for module, source in MODULES_WITH_SOURCE.items() if module != TRANSPORT_MODULE
             and (calls := raw_pipe_calls(ast.parse(source)))}
    assert not found, f"send a message through a Channel (flashcheck.campaign.transport) instead: {found}"


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=lambda c: c.__name__)
def test_every_message_is_a_small_frozen_dataclass(cls):
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
    assert "__slots__" in vars(cls) and not hasattr(cls(*([None] * len(dataclasses.fields(cls)))), "__dict__"), \
        f"{cls.__name__}: slots keep each message's pickle small"


def test_a_channel_carries_messages_and_refuses_anything_else():
    parent, child = channel_pair()
    try:
        sent = messages.PartTask(3, "torch:math", "fp16", 0, 50, ("flashcheck",), None)
        parent.send(sent)
        assert child.receive() == sent
        with pytest.raises(TypeError, match="carries flashcheck.campaign.messages only"):
            parent.send(("chunk", (3, {})))
        assert len(pickle.dumps(messages.Shutdown())) < 80
    finally:
        parent.close()
        child.close()


def test_the_rules_see_what_they_forbid():
    tree = ast.parse("class Odd(messages.Message):\n    pass\nconn.send_bytes(b'')\nx = ctx.Pipe()\n")
    assert _message_classes_outside("m", tree) == ["m:Odd"]
    assert raw_pipe_calls(tree) == ["line 3: send_bytes()", "line 4: Pipe()"]
