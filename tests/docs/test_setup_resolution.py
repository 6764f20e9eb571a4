"""Every ``pip install`` of the README and the examples resolves from the package index alone.

A machine's own pip configuration (a local wheel folder, extra indexes, constraints) can hide what a user
elsewhere gets from PyPI: torch 2.13.0 there is a CUDA build that pins one triton release, and an extra that
asks for another makes the set-up fail with ResolutionImpossible. So each install is resolved (``--dry-run``,
nothing installed) with every pip configuration ignored: no configuration file, no ``PIP_*`` variable.
``fast-deps`` reads each wheel's metadata with HTTP range requests instead of downloading it (torch's wheel is
500 MB), so the resolution takes about a minute. It needs the index: without a network it fails, as the
install itself would.
"""

from __future__ import annotations

import json

import pytest

from ._markdown import ROOT, show
from ._resolution import installs, results

INSTALLS = installs()


def test_the_readme_installs_torch_and_the_interpreter():
    readme = [args for folder, args in INSTALLS if folder == ROOT]
    assert any("torch==" in args and "[cpu" in args for args in readme), readme


@pytest.mark.slow
def test_every_install_resolves_from_the_package_index_alone():
    # The resolutions started with the run (tests/docs/_resolution.py): each waits on the network, not on a core.
    for r in results():
        assert r.status == 0, f"`pip install {r.args}` in {show(r.folder)} does not resolve from the index alone:\n" \
                              f"{r.output[-3000:]}"
        chosen = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                  for item in json.loads(r.report.read_text())["install"]}
        if "torch" in chosen and "triton" in chosen:
            # The triton the index's torch pins (torch 2.13.0: triton 3.7.1) must be one the interpreter runs
            # under (tests/interpreter passes with 3.7.1 and 3.9.0).
            major, minor = (int(part) for part in chosen["triton"].split(".")[:2])
            assert (major, minor) >= (3, 7), (r.args, chosen)
