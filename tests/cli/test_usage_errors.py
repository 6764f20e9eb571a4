"""Bad options are refused before anything runs: exit 2, a message that names the option, echoes its value
and says how to fix it; never a traceback, never a campaign that then cannot write its result."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from flashcheck.cli import main

K = "tests.cli._planted:correct"

# Every count and duration option of every command, at 0 and below.
COUNT_OPTIONS = [
    (["fuzz", K], "--max-examples"), (["fuzz", K], "--jobs"), (["fuzz", K], "--time-budget"),
    (["fuzz", K], "--case-timeout"),
    (["selftest"], "--cases"), (["selftest"], "--bug-cases"), (["selftest"], "--max-n"), (["selftest"], "--jobs"),
    (["selftest"], "--chunk"), (["selftest"], "--time-budget"),
    (["signoff", "torch:math", "--out", "out"], "--max-examples"), (["signoff", "torch:math", "--out", "out"], "--jobs"),
    (["signoff", "torch:math", "--out", "out"], "--min-cases"),
    (["signoff", "torch:math", "--out", "out"], "--min-regime-cases"),
    (["signoff", "torch:math", "--out", "out"], "--time-budget"),
]


@pytest.mark.parametrize("value", ["0", "-1"])
@pytest.mark.parametrize("command, option", COUNT_OPTIONS)
def test_counts_below_one_are_usage_errors(command, option, value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--device", "cpu", option, value]) == 2
    err = capsys.readouterr().err
    assert re.search(rf"{option}=-?[01](\.0)?: expected ", err) and "Pass e.g." in err, err
    assert list(tmp_path.iterdir()) == [], "nothing may run (nor a corpus or report appear) before the check"


@pytest.mark.parametrize("option", ["--min-cases", "--min-regime-cases"])
@pytest.mark.parametrize("value", ["1.5", "ten"])
def test_a_count_that_is_not_a_whole_number_says_how_to_write_one(option, value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["signoff", "torch:math", "--device", "cpu", "--out", "out", option, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{option}: '{value}' is not a whole number: pass e.g. 10" in err, err
    assert list(tmp_path.iterdir()) == []


def _unwritable(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    return str(blocker / "below")  # a path below a regular file cannot be created, even by root


UNWRITABLE = [
    (["fuzz", K, "--json", "{bad}/s.json"], "--json"),
    (["fuzz", K, "--corpus", "{bad}"], "--corpus"),
    (["selftest", "--json", "{bad}/rows.json"], "--json"),
    (["merge", "{summary}", "--json", "{bad}/m.json"], "--json"),
    (["replay", "{case}", "--json", "{bad}/v.json"], "--json"),
]


@pytest.mark.parametrize("argv, option", UNWRITABLE)
def test_unwritable_outputs_are_refused_before_any_case(argv, option, tmp_path, capsys):
    bad = _unwritable(tmp_path)
    argv = [a.format(bad=bad, summary=tmp_path / "none.json", case=tmp_path / "none.json") for a in argv]
    assert main([*argv, "--device", "cpu"] if argv[0] != "merge" else argv) == 2
    err = capsys.readouterr().err
    assert f"{option}='{bad}" in err and "cannot write" in err and "Traceback" not in err, err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, a folder that takes no new file")
def test_a_folder_that_exists_but_takes_no_new_file_is_not_called_missing(tmp_path, capsys):
    assert main(["fuzz", K, "--device", "cpu", "--json", "/proc/x.json", "--corpus", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--json='/proc/x.json': cannot write in '/proc': the folder does not accept new files. " in err, err
    assert "No such file" not in err, err


def test_a_path_below_a_file_names_the_file(tmp_path, capsys):
    assert main(["fuzz", K, "--device", "cpu", "--json", _unwritable(tmp_path) + "/s.json"]) == 2
    assert f"cannot write below '{tmp_path / 'a-file'}': it is a file, not a folder." in capsys.readouterr().err


def test_a_json_path_that_is_a_folder_is_refused(tmp_path, capsys):
    assert main(["fuzz", K, "--device", "cpu", "--json", str(tmp_path), "--corpus", str(tmp_path / "c")]) == 2
    assert "is a folder, not a file" in capsys.readouterr().err


def _without_help(text: str) -> list:
    """Options listed alone on their line whose next line is not their wrapped help text."""
    lines = text.splitlines() + [""]
    alone = re.compile(r"^  (--[\w-]+)(?: [^ ]+)*$")
    return [m[1] for line, after in zip(lines, lines[1:]) if (m := alone.match(line))
            and not re.match(r"^ {10,}\S", after)]


def test_help_is_plain_text_and_documents_every_option(capsys):
    for command in ("fuzz", "replay", "selftest", "signoff", "report", "merge"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert "``" not in text, f"{command} --help shows reStructuredText markup"
        assert not _without_help(text), f"{command} --help: no help text for {_without_help(text)}"
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "``" not in capsys.readouterr().out


def _bad_inputs(tmp_path) -> list:
    """Bad input to every command, each refused with a message of its own."""
    from flashcheck import AttentionCase

    q = torch.ones(1, 1, 2, 16, dtype=torch.float16)
    AttentionCase.create(q, q, q, scale=0.25).save(tmp_path / "anonymous")  # a case that names no kernel
    for name in ("r1", "r2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text('{"schema": "flashcheck-report", "schema_version": 1}')
    (tmp_path / "needs_gpu.py").write_text('raise RuntimeError("this module needs a GPU.")\n')
    (tmp_path / "a-file").write_text("")
    cpu = ["--device", "cpu"]
    return [
        *[[*command, *cpu, option, "0"] for command, option in COUNT_OPTIONS],
        *[[a.format(bad=_unwritable(tmp_path), summary="s.json", case="c.json") for a in argv] + cpu
          for argv, _ in UNWRITABLE if argv[0] != "merge"],
        ["merge", "s.json", "--json", "/proc/m.json"],
        ["fuzz", "needs_gpu:attention", *cpu], ["signoff", "needs_gpu:attention", "--out", "out", *cpu],
        ["fuzz", "nosuch:attention", *cpu], ["fuzz", "torch:nosuch", *cpu], ["fuzz", "torch:math[x=1]", *cpu],
        ["fuzz", K, *cpu, "--preset", "nosuch"], ["fuzz", K, *cpu, "--database", "a-file"],
        ["fuzz", K, *cpu, "--database", "redis://localhost:port"], ["fuzz", K, *cpu, "--backward", "--no-isolation"],
        ["fuzz", K, *cpu, "--case-timeout", "5", "--no-isolation"], ["fuzz", "torch:cudnn", *cpu],
        ["replay", "anonymous.json", *cpu], ["repro", "anonymous.json", "--out", "out", *cpu],
        ["replay", "none.json", *cpu], ["repro", "none.json", "--out", "out", *cpu],
        ["report", "r1", "r2"], ["report", "none"], ["merge", "none.json"],
        ["selftest", *cpu, "--variant", "nosuch"], ["selftest", *cpu, "--head-dims", "x"], ["selftest", "--table", "x"],
    ]


def test_no_refusal_reads_badly(tmp_path, monkeypatch, capsys):
    """Each refusal: exit 2, sentences that end once ("..", " ." are a join gone wrong), a value where a value
    is echoed ("=None" is an option that was not given), and no traceback."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for argv in _bad_inputs(tmp_path):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("flashcheck: error: "), (argv, code, err)
        assert not re.search(r"(?<!\.)\.\.(?!\.)|\s\.(\s|$)|=None\b|Traceback", err), (argv, err)
