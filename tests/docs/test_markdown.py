"""The reading of commands and their expect markers (tests/docs/_markdown.py): a command the tests would not
run must be an error, not silently left out."""

import pytest

from ._markdown import commands

GOOD = """# Title

<!-- expect: clone, no-gpu, exit 4 | no CUDA GPU | second text -->
```sh
pytest --flashcheck-require-gpu
```

```python
print("not a command")
```

<!-- test-command -->
```sh
python -m pytest -q
```
<!-- /test-command -->
"""


def _write(tmp_path, text):
    path = tmp_path / "page.md"
    path.write_text(text)
    return path


def test_marked_commands_are_read_and_the_test_command_is_exempt(tmp_path):
    (command,) = commands(_write(tmp_path, GOOD))
    assert command.block.text == "pytest --flashcheck-require-gpu"
    assert (command.expect.exit, command.expect.output) == (4, ["no CUDA GPU", "second text"])
    assert command.expect.flags == ("clone", "no-gpu")


@pytest.mark.parametrize("text, error", [
    ("Run:\n\n```sh\nflashcheck kernels\n```\n", "needs `<!-- expect: exit N | TEXT -->`"),
    ("<!-- expect: BUG -->\n```sh\nflashcheck kernels\n```\n", "must end its first part with `exit N`"),
    ("<!-- expect: here, exit 0 -->\n```sh\nflashcheck kernels\n```\n", "unknown word(s) ['here']"),
    ("Run:\n\n```\nflashcheck kernels\n```\n", "without a known language"),
    ("Run:\n\n    flashcheck kernels\n", "an indented code block"),
    ("<!-- test-command -->\n```sh\nflashcheck kernels\n```\nno closing marker\n", "needs `<!-- expect:"),
])
def test_an_unmarked_or_hidden_command_is_an_error(tmp_path, text, error):
    with pytest.raises(ValueError, match="page.md:") as raised:
        commands(_write(tmp_path, text))
    assert error in str(raised.value)
