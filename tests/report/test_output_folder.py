"""An output folder that cannot be written is a usage error before anything runs: exit 2, one line naming --out."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def no_campaign(monkeypatch):
    """A sign-off that reaches its campaigns fails the test: the refusal must come first."""
    from flashcheck.report import signoff

    def ran(*args, **kwargs):
        raise AssertionError("a campaign ran before --out was checked")

    monkeypatch.setattr(signoff, "run_campaigns", ran)


def _unwritable(tmp_path, kind: str):
    """A path that cannot be a writable folder, even for root."""
    afile = tmp_path / "a-file"
    afile.write_text("not a folder")
    return afile if kind == "existing file" else afile / "below" / "out"


def _refusal(capsys, value) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err  # one line, no traceback
    assert err.startswith("flashcheck: error: --out=") and repr(str(value)) in err, err
    assert err.count("--out") >= 2, f"the fix names --out too: {err}"
    return err


@pytest.mark.parametrize("kind, says", [("existing file", "is an existing file"), ("below a file", "cannot write")])
def test_signoff_refuses_an_unwritable_out_before_any_campaign(kind, says, tmp_path, capsys, no_campaign):
    from flashcheck.cli import main

    out = _unwritable(tmp_path, kind)
    assert main(["signoff", "torch:math", "--device", "cpu", "--preset", "smoke", "--out", str(out)]) == 2
    assert says in _refusal(capsys, out)


@pytest.mark.parametrize("kind", ["existing file", "below a file"])
def test_report_refuses_an_unwritable_out(kind, signoff_report, tmp_path, capsys):
    from flashcheck.cli import main

    folder = signoff_report[0]
    out = _unwritable(tmp_path, kind)
    assert main(["report", str(folder), "--out", str(out)]) == 2
    _refusal(capsys, out)
    assert main(["report", str(folder), str(folder), "--out", str(out)]) == 2  # a comparison too
    _refusal(capsys, out)


def test_report_refuses_a_read_only_folder(signoff_report, tmp_path, capsys):
    from flashcheck.cli import main

    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):  # root writes anyway: a mode cannot deny it
            pytest.skip("running as root: a folder's mode cannot deny writing")
        assert main(["report", str(signoff_report[0]), "--out", str(folder / "out")]) == 2
        assert "cannot write" in _refusal(capsys, folder / "out")
    finally:
        folder.chmod(0o700)
