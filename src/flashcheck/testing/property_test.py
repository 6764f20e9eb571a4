"""flashcheck inside a kernel repository's tests: a kernel's property test in one line, and verdicts
asserted inside your own tests (``@given`` ones included).

``property_test`` turns a kernel into a hypothesis-driven pytest test, one test id per dtype::

    import flashcheck
    from mykernels import attention          # decorated with @flashcheck.kernel(...)

    test_attention = flashcheck.property_test(attention)                     # test_attention[fp16], ...
    test_attention_fp16 = flashcheck.property_test(attention, dtypes="fp16", preset="adversarial",
                                                   max_examples=200, seed=0)

``assert_passes`` asserts a verdict anywhere, including inside your own hypothesis tests: it is a plain
function, so no function-scoped fixture meets ``@given`` (hypothesis's health check refuses those)::

    from hypothesis import given
    import flashcheck
    from flashcheck.inputs.strategies import cases

    @pytest.mark.flashcheck                  # in -m flashcheck and the summary; no hypothesis deadline
    @given(cases(spec=attention.spec, max_n=64))
    def test_attention_on_my_cases(case):
        flashcheck.assert_passes(attention, case)

A failure shows the verdict (the worst element, its error budget term by term, the diagnosis) and the
exact ``flashcheck replay PATH`` command of the failing case, saved to the corpus folder
(``--flashcheck-corpus``, default ``.flashcheck/corpus`` under pytest's rootdir). Inside ``@given``, the
case saved is the one hypothesis reports, after shrinking. The options and their precedence are in
:mod:`flashcheck.plugin`'s docstring.

Nothing heavy is imported here: torch and the checks load when a test first runs a check.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..contract.counts import check_count
from ..contract.formats import DEVICES
from ..errors import InvalidArgument

__all__ = ["property_test", "assert_passes", "KernelCheckFailed", "register_profiles", "PROFILES",
           "DEFAULT_PRESET", "DEFAULT_CORPUS"]

DEFAULT_PRESET = "smoke"
DEFAULT_CORPUS = ".flashcheck/corpus"
# property_test shrinks a failing case for at most this long (the Triton interpreter can take seconds
# a case); the smallest failing case found by then is the one reported.
SHRINK_SECONDS = 60.0

# Hypothesis settings profiles (``pytest --hypothesis-profile NAME``, or settings.load_profile(NAME)
# after register_profiles()). flashcheck-long also raises property_test's example count.
PROFILES = {
    "flashcheck-ci": dict(derandomize=True, deadline=None, database=None, print_blob=True),
    "flashcheck-long": dict(max_examples=2000, deadline=None),
}


def register_profiles() -> None:
    """Register the hypothesis profiles of :data:`PROFILES` not registered yet (the plugin does it when
    ``--hypothesis-profile`` names one, and property tests when they run); a profile of that name that
    a user registered first is kept."""
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument as NoSuchProfile

    for name, values in PROFILES.items():
        try:
            settings.get_profile(name)
        except NoSuchProfile:
            settings.register_profile(name, **values)


class KernelCheckFailed(AssertionError):
    """A kernel got a failing verdict (BUG, or SUSPICIOUS when not allowed) on a case."""

    def __init__(self, message: str, verdict=None, path: Path | None = None, replay: str | None = None):
        super().__init__(message)
        self.verdict, self.path, self.replay = verdict, path, replay


# ---- what a pytest run tells the checks ---------------------------------------------------------------

@dataclass
class Session:
    """Options of one pytest run, the verdicts it recorded and where failing cases go.

    ``cli`` and ``ini`` hold the options given on the command line and as ini keys, apart, since a
    value written in a test (``property_test(..., max_examples=...)``) sits between the two.
    """

    cli: dict = field(default_factory=dict)
    ini: dict = field(default_factory=dict)
    corpus: Path = field(default_factory=lambda: Path.cwd() / DEFAULT_CORPUS)
    invocation_dir: Path = field(default_factory=Path.cwd)
    import_paths: tuple = ()  # sys.path entries a fresh `flashcheck replay` process also has
    require_gpu: bool = False
    records: list = field(default_factory=list)
    current_test: str | None = None

    def option(self, name: str, code_value=None, default=None):
        """Command line, then the test's own value, then the ini key, then ``default``."""
        for value in (self.cli.get(name), code_value, self.ini.get(name)):
            if value is not None:
                return value
        return default

    def record(self, verdict, case, *, source: str, test: str | None = None, **extra) -> dict:
        rec = verdict.as_dict()
        rec.update(test=test or self.current_test, dtype=case.dtype, source=source, **extra)
        self.records.append(rec)
        return rec


_SESSIONS: list[Session] = []


def push_session(session: Session) -> None:
    _SESSIONS.append(session)


def pop_session(session: Session) -> None:
    if session in _SESSIONS:
        _SESSIONS.remove(session)


def active_session() -> Session | None:
    return _SESSIONS[-1] if _SESSIONS else None


def _session() -> Session:
    """The pytest run's session; outside pytest a default one (auto device, corpus under the cwd)."""
    return active_session() or Session(import_paths=tuple(sys.path))


# ---- the replay command ---------------------------------------------------------------------------------

def _display(path: Path, base: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(base.resolve()))
    except ValueError:
        return str(Path(path).resolve())


def replay_command(path: Path, kernel, *, device: str, session: Session) -> str:
    """The exact shell command, run from the directory pytest was started in, that re-runs a saved case.

    The case records how to reach its kernel (:func:`flashcheck.kernels.origin.kernel_origin`); a module
    that a fresh process would not find on its own gets a ``PYTHONPATH`` prefix as well."""
    from ..files import replay_command as replay_path_command
    from ..kernels.origin import import_root, source_of

    command = replay_path_command(_display(path, session.invocation_dir), device=device)
    prefix = ""
    source = source_of(kernel)
    if source and not source.startswith(("torch:", "flashcheck:")):
        root = import_root(source.split(":", 1)[0])
        known = {str(Path(p).resolve()) for p in session.import_paths if p}
        if root is not None and str(root) not in known:
            prefix = f"PYTHONPATH={shlex.quote(_display(root, session.invocation_dir) or '.')} "
    return prefix + command


def _save(session: Session, verdict, case, kernel, *, label: str, device: str, corpus=None) -> tuple[Path, str]:
    from ..campaign.corpus import save_finding

    folder = Path(corpus) if corpus is not None else session.corpus
    folder.mkdir(parents=True, exist_ok=True)
    if not (case.provenance or {}).get("kernel"):  # cases(): the kernel was not known when it was drawn
        case = dataclasses.replace(case, provenance={**(case.provenance or {}), "kernel": verdict.kernel})
    path = save_finding(folder, verdict, case, label=label, kernel=kernel)
    return path, replay_command(path, kernel, device=device, session=session)


def _in_hypothesis() -> bool:
    try:
        from hypothesis import currently_in_test_context
    except ImportError:  # pragma: no cover - hypothesis is a dependency
        return False
    return currently_in_test_context()


def _final_hypothesis_run() -> bool:
    """True outside hypothesis, and on the run hypothesis reports (the shrunk failing example)."""
    if not _in_hypothesis():
        return True
    from hypothesis.control import current_build_context

    return bool(getattr(current_build_context(), "is_final", True))


def _default_device(session: Session, code_value=None) -> str:
    device = session.option("device", code_value)
    if device is None:
        import torch

        device = "cuda" if session.require_gpu or torch.cuda.is_available() else "cpu"
    return device


# ---- assert_passes --------------------------------------------------------------------------------------

def assert_passes(kernel, case, *, allow_suspicious: bool = True, device: str | None = None, corpus=None,
                  **check_options):
    """Check ``kernel`` on ``case`` and return the verdict; raise :class:`KernelCheckFailed` (an
    ``AssertionError``) on BUG, and on SUSPICIOUS unless ``allow_suspicious``.

    A plain function: call it from any test, ``@given`` ones included, with no fixture. The failure
    message is the verdict and the ``flashcheck replay`` command of the case, saved under ``corpus``
    (default: the run's ``--flashcheck-corpus``). Inside ``@given`` only the case hypothesis finally
    reports is saved, not every step of its shrinking. A case the kernel declines
    (:class:`flashcheck.Unsupported`) or that does not fit in memory is not judged: inside ``@given``
    hypothesis discards it, in a plain pytest test the test is skipped, elsewhere the verdict is
    returned with ``verdict.skipped`` set. ``device`` defaults to ``--flashcheck-device``, else CUDA
    when available; ``check_options`` go to :func:`flashcheck.check`.

    Example::

        from flashcheck.inputs.strategies import cases

        @pytest.mark.flashcheck      # no hypothesis deadline (a kernel's first call compiles it)
        @given(cases(spec=attention.spec, max_n=64))
        def test_attention(case):
            flashcheck.assert_passes(attention, case)

    Without the marker, give the test ``@settings(deadline=None)`` or run with
    ``--hypothesis-profile flashcheck-ci``: hypothesis's default 200 ms deadline trips on a first call.
    """
    __tracebackhide__ = True  # pytest shows the verdict, not this function's source
    if not isinstance(allow_suspicious, bool):
        raise InvalidArgument("allow_suspicious", allow_suspicious, "expected True or False",
                              "Pass allow_suspicious=False to fail on SUSPICIOUS verdicts too.")
    if device is not None and device not in DEVICES:
        raise InvalidArgument("device", device, "unknown device", f"Pass one of {list(DEVICES)} or None.")
    from ..judge.check import check
    from ..judge.verdict import BUG, SUSPICIOUS

    session = _session()
    device = _default_device(session, device)
    verdict = check(kernel, case, device=device, **check_options)
    rec = session.record(verdict, case, source="assert_passes")
    if verdict.skipped:
        _not_judged(verdict.skipped)
        return verdict
    if verdict.status == BUG or (verdict.status == SUSPICIOUS and not allow_suspicious):
        path = replay = None
        lines = [str(verdict)]
        if _final_hypothesis_run():
            label = "shrunk" if _in_hypothesis() else "found"
            path, replay = _save(session, verdict, case, kernel, label=label, device=device, corpus=corpus)
            rec.update(saved=str(path), replay=replay)
            lines += [f"saved: {_display(path, session.invocation_dir)}", f"replay: {replay}"]
        raise KernelCheckFailed("\n".join(lines), verdict, path, replay)
    return verdict


def _not_judged(reason: str) -> None:
    if _in_hypothesis():
        from hypothesis import reject

        reject()
    if active_session() is not None:
        import pytest

        pytest.skip(f"flashcheck did not judge the case: {reason}")


# ---- property_test ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Options:
    preset: str | None
    max_examples: int | None
    seed: int | None
    device: str | None


def property_test(kernel, *, preset: str | os.PathLike | None = None, dtypes=None, max_examples: int | None = None,
                  seed: int | None = None, device: str | None = None, backward: bool = False):
    """A pytest test function that checks ``kernel`` on cases drawn by hypothesis from its spec.

    Assign it to a ``test_*`` name in a test module (``test_attention = flashcheck.property_test(attention)``):
    pytest collects one test per dtype (``test_attention[fp16]``, ...). Each draws up to ``max_examples``
    recipes from :func:`flashcheck.inputs.strategies.recipes` over the kernel's spec and the preset's regimes and
    sizes, checks each case with :func:`flashcheck.check`, and on the first BUG saves the case to the
    corpus, shrinks it with hypothesis (for at most :data:`SHRINK_SECONDS`), saves the smallest one, and
    fails with its verdict and its ``flashcheck replay`` command. SUSPICIOUS verdicts do not fail the
    test; they are counted in the summary and the JSON.

    ``kernel``: a kernel decorated with ``@flashcheck.kernel(...)`` (a plain callable gets the
    conservative default spec). ``preset``: a preset name (``smoke``, ``adversarial``, ...) or a TOML
    file, relative to the test module's folder or the current directory (default ``smoke``).
    ``dtypes``: some of the spec's dtypes (default: all of them). ``max_examples`` (default: the
    preset's), ``seed`` (default: hypothesis's own randomness),
    ``device`` (``cuda`` or ``cpu``; default CUDA when available). The command line
    (``--flashcheck-preset``, ``--flashcheck-max-examples``, ``--flashcheck-seed``,
    ``--flashcheck-device``) wins over these, and these win over the ini keys. ``backward=True`` adds a
    test of the backward pass per dtype (``test_attention[fp16-backward]``, ...): each case also draws a
    dO regime, and :func:`flashcheck.check_backward` judges dQ, dK and dV (the spec must declare
    ``backward=True``).
    """
    from ..contract.spec import Kernel, as_kernel

    if isinstance(kernel, str) or not (isinstance(kernel, Kernel) or callable(kernel)):
        raise InvalidArgument("kernel", kernel, "expected a kernel function (ideally decorated with "
                              "@flashcheck.kernel(...))",
                              "Pass the kernel itself: flashcheck.property_test(attention). For a built-in "
                              "or an import path, resolve it first: flashcheck.kernels.registry.resolve_kernel(NAME).")
    kern = as_kernel(kernel)
    if not isinstance(backward, bool):
        raise InvalidArgument("backward", backward, "expected True or False",
                              "Pass backward=True to test the backward pass too.")
    if backward and not kern.spec.backward:
        raise InvalidArgument("backward", backward, f"{kern.name} declares no backward pass",
                              "Declare backward=True in its spec (@flashcheck.kernel(backward=True, ...)) if "
                              "autograd can differentiate it, or leave backward out.")
    if preset is not None:
        if not isinstance(preset, (str, os.PathLike)) or not str(preset):
            raise InvalidArgument("preset", preset, "expected a preset name or the path of a TOML file",
                                  "Pass e.g. preset='smoke' or preset='tests/my-preset.toml'.")
        from ..inputs.presets import builtin_presets, load_preset

        preset = str(preset)
        caller = Path(sys._getframe(1).f_globals.get("__file__") or ".").resolve().parent
        if preset not in builtin_presets() and not Path(preset).is_absolute() and (caller / preset).is_file():
            preset = str(caller / preset)  # a TOML file next to the test module
        load_preset(preset)  # refused now, at collection, with the preset's own message
    if dtypes is None:
        chosen = list(kern.spec.dtypes)
    else:
        chosen = [dtypes] if isinstance(dtypes, str) else list(dtypes) if isinstance(dtypes, (list, tuple)) else None
        if not chosen or any(d not in kern.spec.dtypes for d in chosen) or len(set(chosen)) != len(chosen):
            raise InvalidArgument("dtypes", dtypes, f"expected distinct dtypes of the kernel's spec {kern.spec.dtypes}",
                                  "Pass e.g. dtypes=('fp16',), or leave it out to test every dtype the spec declares.")
    check_count("max_examples", max_examples, none_ok=True)
    check_count("seed", seed, minimum=0, none_ok=True)
    if device is not None and device not in DEVICES:
        raise InvalidArgument("device", device, "unknown device", f"Pass one of {list(DEVICES)}, or None for "
                              "CUDA when available.")
    options = _Options(preset, max_examples, seed, device)

    import pytest

    def test_property(flashcheck_dtype, flashcheck_pass, request):
        _run_property_test(kern, flashcheck_dtype, options, request.node.nodeid, backward=flashcheck_pass == "backward")

    test_property.__doc__ = f"flashcheck property test of {kern.name}"
    test_property.flashcheck_kernel = kern
    params = [pytest.param(d, "forward", id=d) for d in chosen]
    params += [pytest.param(d, "backward", id=f"{d}-backward") for d in chosen] if backward else []
    return pytest.mark.flashcheck(pytest.mark.parametrize("flashcheck_dtype,flashcheck_pass", params)(test_property))


class _CaseFailed(Exception):
    def __init__(self, verdict, case, recipe):
        super().__init__(verdict.status)
        self.verdict, self.case, self.recipe = verdict, case, recipe


@dataclass
class _Run:
    generated: int = 0       # cases drawn before the first failure
    shrink_cases: int = 0    # cases tried while shrinking
    judged: int = 0
    skipped: dict = field(default_factory=dict)
    first: _CaseFailed | None = None
    last: _CaseFailed | None = None
    found_path: Path | None = None
    found_replay: str | None = None
    failures: dict = field(default_factory=dict)  # recipe -> _CaseFailed, to replay from memory
    shrink_deadline: float = math.inf
    shrink_cut: bool = False


def _strategy_options(preset, spec) -> dict:
    """The preset's strategy options, fitted to the spec where the preset cannot know it: head dims the
    spec does not allow fall back to the spec's, and lengths reach the spec's ``seq_multiple``."""
    options = preset.strategy_options()
    if options["head_dims"] is not None:
        allowed = set(spec.allowed_head_dims())
        options["head_dims"] = [d for d in options["head_dims"] if d in allowed] or None
    if options["max_n"] < spec.seq_multiple:
        options["max_n"] = spec.seq_multiple
    return options


def _run_property_test(kern, dtype: str, options: _Options, nodeid: str, *, backward: bool = False) -> None:
    import pytest

    session = active_session()
    if session is None:
        pytest.fail("flashcheck.property_test needs flashcheck's pytest plugin (it was disabled: drop "
                    "-p no:flashcheck, or add `pytest_plugins = ['flashcheck.plugin']` to a conftest.py)",
                    pytrace=False)
    from hypothesis import HealthCheck, Verbosity, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.errors import Flaky

    from ..inputs.presets import load_preset
    from ..inputs.strategies import _without_local_constants, recipes
    from ..judge.backward import backward_case, check_backward
    from ..judge.check import check
    from ..judge.properties import properties_for

    register_profiles()
    preset = load_preset(session.option("preset", options.preset, DEFAULT_PRESET))
    examples = session.option("max_examples", options.max_examples)
    if examples is None:
        long_profile = settings.get_current_profile_name() == "flashcheck-long"
        examples = settings.default.max_examples if long_profile else preset.max_examples
    seed = session.option("seed", options.seed)
    device = _default_device(session, options.device)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("no CUDA GPU here (a GPU lane passes --flashcheck-require-gpu so that it cannot pass "
                        "by skipping; --flashcheck-device cpu runs on the CPU)")
    if device not in kern.spec.devices:
        pytest.skip(f"{kern.name} declares devices {kern.spec.devices}, and this run's device is {device}")
    spec = kern.spec.for_backward() if backward else kern.spec  # a backward test skips the backward's defects
    strategy = recipes(spec=spec, dtypes=[dtype], **_strategy_options(preset, spec))
    run = _Run()

    def judge(recipe, upstream):
        shrinking = run.first is not None
        if shrinking and time.monotonic() > run.shrink_deadline:
            # Out of shrinking time: known failures fail again from memory, anything else passes, so
            # hypothesis ends its shrink at once with the smallest failing case so far.
            run.shrink_cut = True
            key = (recipe, upstream) if backward else recipe
            if key in run.failures:
                raise run.failures[key]
            return
        case = recipe.build(kernel=kern.name)
        if backward:
            case = backward_case(case, upstream=upstream, seed=recipe.seed)
            verdict = check_backward(kern, case, device=device, exclusions=True)
        else:
            verdict = check(kern, case, device=device, properties=properties_for(recipe.seed))
        if shrinking:
            run.shrink_cases += 1
        else:
            run.generated += 1
        rec = session.record(verdict, case, source="property_test", test=nodeid,
                             phase="shrink" if shrinking else "generate", **({"pass": "backward"} if backward else {}))
        if verdict.skipped:
            kind = verdict.skipped.split(":")[0]
            run.skipped[kind] = run.skipped.get(kind, 0) + 1
            return
        run.judged += 1
        if verdict.status == "BUG":
            failure = _CaseFailed(verdict, case, (recipe, upstream) if backward else recipe)
            if run.first is None:  # saved the moment it fails: an interrupted shrink loses nothing
                run.first = failure
                run.shrink_deadline = time.monotonic() + SHRINK_SECONDS
                run.found_path, run.found_replay = _save(session, verdict, case, kern, label="found", device=device)
                rec.update(saved=str(run.found_path), replay=run.found_replay)
            run.last = run.failures[failure.recipe] = failure
            raise failure

    if backward:
        from hypothesis import strategies as st

        from ..inputs.regimes import UPSTREAM_REGIMES

        def body(recipe, upstream):
            judge(recipe, upstream)

        given_args = dict(recipe=strategy, upstream=st.sampled_from(sorted(UPSTREAM_REGIMES)))
    else:
        def body(recipe):
            judge(recipe, None)

        given_args = dict(recipe=strategy)
    body._hypothesis_internal_add_digest = nodeid.encode()  # a database key and a random stream per test id
    test = given(**given_args)(body)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    verbosity = settings.default.verbosity if settings.default.verbosity > Verbosity.normal else Verbosity.quiet
    test = settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck),
                    report_multiple_bugs=False, verbosity=verbosity)(test)
    failure = None
    try:
        with _without_local_constants():
            test()
    except _CaseFailed as exc:
        failure = exc
    except Flaky:  # the smallest failure did not fail again: report the last one that did
        failure = run.last
    if failure is None:
        if run.judged == 0:
            why = ", ".join(f"{n} {k}" for k, n in sorted(run.skipped.items())) or "no case drawn"
            pytest.fail(f"flashcheck judged no case of {kern.name} ({dtype}): {why}. A test that judged "
                        "nothing is not a pass: check the spec, the preset and the device.", pytrace=False)
        return
    pytest.fail(_failure_message(session, kern, dtype, device, run, failure), pytrace=False)


def _failure_message(session: Session, kern, dtype: str, device: str, run: _Run, failure: _CaseFailed) -> str:
    first = run.first
    same = first is not None and failure.recipe == first.recipe
    if same:
        path, replay = run.found_path, run.found_replay
    else:
        path, replay = _save(session, failure.verdict, failure.case, kern, label="shrunk", device=device)
        for rec in reversed(session.records):  # the record of the shrunk case names its file too
            if rec.get("case") == failure.verdict.case and rec.get("status") == failure.verdict.status:
                rec.update(saved=str(path), replay=replay)
                break
    tried = f"{run.shrink_cases} more case{'s' if run.shrink_cases != 1 else ''}"
    if run.shrink_cut:
        how = f"case {run.generated} drawn, " + (f"shrunk over {tried}" if not same else f"{tried} tried") + \
              f" (shrinking stopped after {SHRINK_SECONDS:g} s)"
    elif not same:
        how = f"case {run.generated} drawn, shrunk over {tried}"
    else:
        how = f"case {run.generated} drawn (shrinking tried {tried}: none smaller fails)"
    what = f"{dtype}, backward" if isinstance(failure.recipe, tuple) else dtype
    lines = [f"flashcheck: {kern.name} ({what}, {device}) failed on {how}:", str(failure.verdict),
             f"drawn from: {failure.recipe!r}",
             f"saved: {_display(path, session.invocation_dir)}"]
    if not same and run.found_path is not None:
        lines.append(f"first found as: {_display(run.found_path, session.invocation_dir)}")
    lines.append(f"replay: {replay}")
    return "\n".join(lines)


def summary_rows(records: list) -> list[dict]:
    """One row per kernel, dtype and pass (forward or backward): cases (``shrinking`` of them tried while hypothesis shrank a failure),
    verdicts, skips, the largest error/budget, and the replay commands of the failing cases saved."""
    rows: dict = {}
    for r in records:
        key = (r.get("kernel") or "?", r.get("dtype") or "?", r.get("pass") or "forward")
        row = rows.setdefault(key, {"kernel": key[0], "dtype": key[1], "pass": key[2], "cases": 0, "PASS": 0,
                                    "SUSPICIOUS": 0, "BUG": 0, "skipped": 0, "shrinking": 0, "max_ratio": None,
                                    "replay": []})
        row["cases"] += 1
        row["shrinking"] += r.get("phase") == "shrink"
        if r.get("skipped"):
            row["skipped"] += 1
        else:
            row[r["status"]] += 1
        ratio = r.get("max_ratio")
        if isinstance(ratio, (int, float)) and math.isfinite(ratio):
            row["max_ratio"] = ratio if row["max_ratio"] is None else max(row["max_ratio"], ratio)
        if r.get("replay"):
            row["replay"].append(r["replay"])
    return [rows[k] for k in sorted(rows)]
