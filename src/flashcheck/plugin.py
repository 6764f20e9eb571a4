"""pytest plugin of flashcheck, loaded through the ``pytest11`` entry point.

Usage in a kernel repository's tests (``mykernels.attention`` decorated with ``@flashcheck.kernel(...)``)::

    import flashcheck
    from flashcheck.strategies import cases
    from hypothesis import given
    from mykernels import attention

    # one hypothesis-driven test per dtype of the spec: test_attention[fp16], test_attention[bf16], ...
    test_attention = flashcheck.property_test(attention)

    # your own hypothesis test: assert_passes is a plain function, so @given meets no function-scoped fixture
    @given(cases(spec=attention.spec, max_n=64))
    def test_attention_my_way(case):
        flashcheck.assert_passes(attention, case)

    # the `flashcheck` fixture (session-scoped, so it also works under @given) does the same
    def test_one_case(flashcheck):
        flashcheck.check(attention, my_case)

A failing test prints the verdict (worst element, its error budget term by term, the diagnosis) and the
exact ``flashcheck replay PATH --device DEV`` command of the failing case, saved in the corpus folder.

Options (each also an ini key, ``flashcheck_preset`` and so on; the command line wins over a value
written in the test, which wins over the ini key):

- ``--flashcheck-preset NAME|PATH``: property_test's regimes and sizes (default ``smoke``).
- ``--flashcheck-max-examples N``: cases per property test and dtype (default: the preset's; with
  ``--hypothesis-profile flashcheck-long``, that profile's 2000).
- ``--flashcheck-seed S``: fixes every drawn case (default: hypothesis's own randomness).
- ``--flashcheck-device cuda|cpu``: default CUDA when available; ``cpu`` also sets ``TRITON_INTERPRET=1``
  (unless set) before test modules import triton, so Triton kernels run under the interpreter.
- ``--flashcheck-json PATH``: every verdict of the run, a summary per kernel and dtype, and the replay
  command of each saved case, as JSON (also under pytest-xdist: workers send theirs to the controller).
- ``--flashcheck-corpus DIR``: where failing cases are saved (default ``.flashcheck/corpus`` under the
  rootdir; relative ini paths are relative to the ini file).
- ``--flashcheck-require-gpu``: a GPU lane cannot pass by skipping: with no CUDA GPU visible the run stops
  at once with an error (exit code 4), and the default device is ``cuda``.

Hypothesis profiles ``flashcheck-ci`` (derandomize, no deadline, no example database) and
``flashcheck-long`` (2000 examples, no deadline) are chosen with hypothesis's own option,
``--hypothesis-profile flashcheck-ci`` (also in ini ``addopts``); call
``flashcheck.testing.session.register_profiles()`` to load one from a conftest. Tests made by property_test, and
tests using the fixture, carry the ``flashcheck`` marker (``-m flashcheck``); a ``@given`` test with that
marker (put ``@pytest.mark.flashcheck`` on one that calls ``assert_passes``) runs with no hypothesis
deadline, since a kernel's first call compiles it. The terminal summary has a line per kernel and dtype:
cases, verdicts, skips, the largest error/budget, and the replay commands.

Loading the plugin imports neither torch nor triton (nor hypothesis): they load when a check first runs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from .contract.counts import check_count
from .contract.formats import DEVICES
from .errors import InvalidArgument, sentences
from .files import write_json
from .inputs.presets import builtin_presets, load_preset
from .testing import session as testing

_KEY = "flashcheck_verdicts"
_STASH = pytest.StashKey[testing.Session]()
# What a fresh `flashcheck replay` process can import: sys.path as it was when pytest loaded its plugins,
# before pytest put test folders (rootdir, `pythonpath`) on it; the current directory is not on a script's path.
_IMPORT_PATHS = tuple(p for p in sys.path if p and p != os.getcwd())

# name -> (ini type, help); the command-line option is --flashcheck-NAME with dashes
_OPTIONS = {
    "preset": ("string", "preset for flashcheck.property_test: a name (smoke, adversarial, ...) or a TOML path "
                         f"(default {testing.DEFAULT_PRESET})"),
    "max_examples": ("string", "cases per flashcheck property test and dtype (default: the preset's)"),
    "seed": ("string", "seed fixing every case flashcheck's property tests draw"),
    "device": ("string", "device for flashcheck checks: cuda or cpu (default: cuda when available); cpu also "
                         "sets TRITON_INTERPRET=1 unless it is set"),
    "json": ("string", "write every flashcheck verdict of the run, and a summary, to PATH as JSON"),
    "corpus": ("string", f"folder where failing cases are saved (default {testing.DEFAULT_CORPUS} under the rootdir)"),
    "require_gpu": ("bool", "fail the run at once when no CUDA GPU is visible (a GPU lane must not pass by skipping)"),
}


def pytest_addoption(parser):
    group = parser.getgroup("flashcheck", "flashcheck: numerical checks of attention kernels")
    metavars = {"preset": "NAME|PATH", "max_examples": "N", "seed": "S", "json": "PATH", "corpus": "DIR"}
    for name, (kind, help_text) in _OPTIONS.items():
        flag = "--flashcheck-" + name.replace("_", "-")
        if kind == "bool":
            group.addoption(flag, action="store_true", default=None, help=help_text)
        elif name == "device":
            group.addoption(flag, default=None, choices=DEVICES, help=help_text)
        else:
            group.addoption(flag, default=None, metavar=metavars[name], help=help_text)
        parser.addini("flashcheck_" + name, help_text + " (ini key; the command line wins)", type=kind,
                      default=False if kind == "bool" else "")


def _usage(where: str, value, problem: str, fix: str):
    return pytest.UsageError(f"flashcheck: {sentences(f'{where}={value!r}: {problem}', fix)}")


def _parse(name: str, value, where: str, base: Path):
    if name in ("max_examples", "seed"):
        minimum = 1 if name == "max_examples" else 0
        try:
            return check_count(where, int(value), minimum=minimum)
        except (TypeError, ValueError, InvalidArgument):
            raise _usage(where, value, f"expected an integer >= {minimum}",
                         f"Pass e.g. {where} {max(minimum, 10)}.") from None
    if name == "device":
        if value not in DEVICES:
            raise _usage(where, value, "unknown device", f"Use one of {list(DEVICES)}.")
        return value
    if name == "preset":
        text = str(value)
        if text not in builtin_presets() and not Path(text).is_absolute() and (base / text).is_file():
            text = str(base / text)  # a path relative to the ini file (or the invocation directory)
        try:
            load_preset(text)
        except InvalidArgument as exc:
            raise _usage(where, value, exc.problem, exc.fix) from None
        return text
    if name in ("json", "corpus"):
        return base / value
    return value


def _read_options(config) -> tuple[dict, dict]:
    cli, ini = {}, {}
    ini_base = config.inipath.parent if config.inipath else config.rootpath
    cli_base = config.invocation_params.dir
    for name, (kind, _) in _OPTIONS.items():
        flag = "--flashcheck-" + name.replace("_", "-")
        value = config.getoption(flag)
        if value is not None:
            cli[name] = _parse(name, value, flag, cli_base)
        raw = config.getini("flashcheck_" + name)
        if kind == "bool":
            if raw:
                ini[name] = True
        elif raw not in (None, ""):
            ini[name] = _parse(name, str(raw).strip(), "ini key flashcheck_" + name, ini_base)
    return cli, ini


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.addinivalue_line("markers", "flashcheck: a flashcheck check of an attention kernel "
                                       "(flashcheck.property_test, or a test using the flashcheck fixture)")
    # Before hypothesis's own pytest_configure loads the profile named by --hypothesis-profile.
    if str(config.getoption("--hypothesis-profile", None) or "") in testing.PROFILES:
        testing.register_profiles()
    cli, ini = _read_options(config)
    session = testing.Session(cli=cli, ini=ini, invocation_dir=config.invocation_params.dir,
                              import_paths=_IMPORT_PATHS)
    session.corpus = session.option("corpus", default=config.rootpath / testing.DEFAULT_CORPUS)
    session.require_gpu = bool(session.option("require_gpu", default=False))
    device = session.option("device")
    if session.require_gpu:
        _require_gpu(device)
    if device == "cpu":  # before test modules import triton: Triton kernels run under the interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
    config.stash[_STASH] = session
    testing.push_session(session)


def _require_gpu(device) -> None:
    if device == "cpu":
        raise pytest.UsageError("flashcheck: --flashcheck-require-gpu with device cpu: a GPU lane runs on the GPU. "
                                "Drop --flashcheck-require-gpu (or flashcheck_require_gpu in the ini file) for a CPU run.")
    import torch  # only for a GPU lane: the plugin is loaded by every pytest run

    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise pytest.UsageError(
            "flashcheck: --flashcheck-require-gpu: no CUDA GPU is visible to this process (torch "
            f"{torch.__version__}, CUDA build {torch.version.cuda}, torch.cuda.is_available() is False"
            + (f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "")
            + "), so this GPU lane would pass by skipping. Run it on a machine with a CUDA GPU and a CUDA build "
              "of torch, or drop --flashcheck-require-gpu for a CPU run.")


def pytest_unconfigure(config):
    session = config.stash.get(_STASH, None)
    if session is not None:
        testing.pop_session(session)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    session = item.config.stash.get(_STASH, None)
    if session is None:
        return (yield)
    session.current_test = item.nodeid
    try:
        return (yield)
    finally:
        session.current_test = None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "flashcheck" in getattr(item, "fixturenames", ()) and item.get_closest_marker("flashcheck") is None:
            item.add_marker(pytest.mark.flashcheck)
        if item.get_closest_marker("flashcheck") is not None:
            _no_deadline(item)


def _no_deadline(item) -> None:
    """A ``@given`` test marked ``flashcheck`` (or using the fixture) runs with no hypothesis deadline and
    no too-slow health check: a kernel's first call compiles it, the oracle's first call warms up, and a
    case's tensors take time to build on a busy machine, so times say nothing about the kernel."""
    fn = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
    if not getattr(fn, "is_hypothesis_test", False):
        return
    from hypothesis import HealthCheck, settings  # here: loading the plugin imports no hypothesis

    from .hypothesis_internals import given_settings, set_given_settings  # as hypothesis, for the same reason

    current = given_settings(fn)
    suppressed = list(current.suppress_health_check)
    if current.deadline is not None or HealthCheck.too_slow not in suppressed:
        relaxed = settings(current, deadline=None, suppress_health_check=suppressed + [HealthCheck.too_slow])
        set_given_settings(fn, relaxed)


class FlashcheckFixture:
    """What the ``flashcheck`` fixture gives a test: ``check`` records and asserts verdicts."""

    def __init__(self, config):
        self._config = config
        session = config.stash[_STASH]
        self.device = session.option("device")
        self.corpus = session.corpus

    def check(self, kernel, case, *, allow_suspicious: bool = True, **options):
        """Check ``kernel`` on ``case``; fail the test on BUG (and on SUSPICIOUS unless allowed), with the
        verdict and the replay command of the saved case (see :func:`flashcheck.assert_passes`)."""
        __tracebackhide__ = True
        from .testing.asserts import assert_passes  # imports torch: the plugin is loaded by every pytest run

        return assert_passes(kernel, case, allow_suspicious=allow_suspicious, **options)


@pytest.fixture(scope="session")
def flashcheck(pytestconfig):
    """flashcheck's checks for a test: ``flashcheck.check(kernel, case)``. Session-scoped, so a
    ``@given`` test can take it without tripping hypothesis's function-scoped-fixture health check."""
    return FlashcheckFixture(pytestconfig)


def pytest_sessionfinish(session):
    config = session.config
    state = config.stash.get(_STASH, None)
    if state is None:
        return
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the verdicts to the controller
        workeroutput[_KEY] = json.dumps(state.records, default=str)
        return
    path = state.option("json")
    if path:
        rows = testing.summary_rows(state.records)
        write_json(path, {"summary": rows, "verdicts": state.records,
                          "replay": [cmd for row in rows for cmd in row["replay"]]})


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist controller: collect a finished worker's verdicts."""
    data = getattr(node, "workeroutput", {}).get(_KEY)
    state = node.config.stash.get(_STASH, None)
    if data and state is not None:
        state.records.extend(json.loads(data))


def pytest_terminal_summary(terminalreporter, config):
    state = config.stash.get(_STASH, None)
    if state is None or not state.records or getattr(config, "workeroutput", None) is not None:
        return
    terminalreporter.section("flashcheck")
    for row in testing.summary_rows(state.records):
        ratio = "n/a" if row["max_ratio"] is None else f"{row['max_ratio']:.3g}"
        skipped = f", {row['skipped']} skipped" if row["skipped"] else ""
        shrinking = f" ({row['shrinking']} while shrinking)" if row["shrinking"] else ""
        terminalreporter.write_line(
            f"{row['kernel']} {row['dtype']}{' backward' if row['pass'] == 'backward' else ''}: {row['cases']} cases{shrinking}, {row['PASS']} PASS, {row['SUSPICIOUS']} "
            f"SUSPICIOUS, {row['BUG']} BUG{skipped}; max error/budget {ratio}")
        for command in row["replay"]:
            terminalreporter.write_line(f"    replay: {command}")
    path = state.option("json")
    if path:
        terminalreporter.write_line(f"flashcheck verdicts written to {path}")
