"""A kernel's property test in one line: ``property_test`` turns a kernel into a hypothesis-driven
pytest test, one test id per dtype (and pass)::

    import flashcheck
    from mykernels import attention          # decorated with @flashcheck.kernel(...)

    test_attention = flashcheck.property_test(attention)                     # test_attention[fp16], ...
    test_attention_fp16 = flashcheck.property_test(attention, dtypes="fp16", preset="adversarial",
                                                   max_examples=200, seed=0)

A failure shows the verdict (the worst element, its error budget term by term, the diagnosis) and the
exact ``flashcheck replay PATH`` command of the failing case, saved to the corpus folder
(``--flashcheck-corpus``, default ``.flashcheck/corpus`` under pytest's rootdir). The options and their
precedence are in :mod:`flashcheck.plugin`'s docstring; hypothesis is driven by the campaigns' engine
(:mod:`flashcheck.campaign.engine`). Verdicts asserted in your own tests: :mod:`flashcheck.testing.asserts`.

Nothing heavy is imported here: torch and the checks load when a test first runs a check.
"""

from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hypothesis import Phase, Verbosity, settings
from hypothesis import strategies as st
from hypothesis.database import InMemoryExampleDatabase

from ..campaign.database import PlannedDatabase
from ..campaign.engine import Outcome, Shrink, hypothesis_test, run_test
from ..contract.counts import check_count
from ..contract.formats import DEVICES
from ..contract.head_dims import spec_choices
from ..contract.spec import BACKWARD_FIX, Kernel, as_kernel
from ..errors import InvalidArgument
from ..hypothesis_internals import without_local_constants
from ..inputs.covering import covering_plan, covering_size, planned_choices
from ..inputs.presets import builtin_presets, load_preset
from ..inputs.recipe_draws import recipe_pools, recipes
from ..inputs.regimes import UPSTREAM_REGIMES
from ..judge.backward import backward_case, check_backward
from ..judge.check import check
from ..judge.properties import properties_for
from ..words import counted
from .asserts import display_path, save_failure
from .session import DEFAULT_PRESET, Session, active_session, default_device, register_profiles

__all__ = ["SHRINK_SECONDS", "property_test"]

# property_test shrinks a failing case for at most this long (the Triton interpreter can take seconds
# a case); the smallest failing case found by then is the one reported.
SHRINK_SECONDS = 60.0


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
    recipes from :func:`flashcheck.inputs.recipe_draws.recipes` over the kernel's spec and the preset's regimes and
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
    if isinstance(kernel, str) or not (isinstance(kernel, Kernel) or callable(kernel)):
        raise InvalidArgument("kernel", kernel, "expected a kernel function (ideally decorated with "
                              "@flashcheck.kernel(...))",
                              "Pass the kernel itself: flashcheck.property_test(attention). For a built-in "
                              "or an import path, resolve it first: flashcheck.kernels.registry.resolve_kernel(NAME).")
    kern = as_kernel(kernel)
    if not isinstance(backward, bool):
        raise InvalidArgument("backward", backward, "expected True or False",
                              "Pass backward=True to test the backward pass too.")
    problem = kern.spec.backward_problem() if backward else None
    if problem:
        raise InvalidArgument("backward", backward, f"{kern.name} {problem}", f"{BACKWARD_FIX}, or leave backward out.")
    if preset is not None:
        if not isinstance(preset, (str, os.PathLike)) or not str(preset):
            raise InvalidArgument("preset", preset, "expected a preset name or the path of a TOML file",
                                  "Pass e.g. preset='smoke' or preset='tests/my-preset.toml'.")
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

    import pytest  # pytest is no dependency of flashcheck: only the test made here needs it

    def test_property(flashcheck_dtype, flashcheck_pass, request):
        _run_property_test(kern, flashcheck_dtype, options, request.node.nodeid, backward=flashcheck_pass == "backward")

    test_property.__doc__ = f"flashcheck property test of {kern.name}"
    test_property.flashcheck_kernel = kern
    params = [pytest.param(d, "forward", id=d) for d in chosen]
    params += [pytest.param(d, "backward", id=f"{d}-backward") for d in chosen] if backward else []
    return pytest.mark.flashcheck(pytest.mark.parametrize("flashcheck_dtype,flashcheck_pass", params)(test_property))


@dataclass
class _Run(Shrink):
    """One property test's hypothesis run; its failures are :class:`_Failed`."""

    generated: int = 0       # cases drawn before the first failure
    shrink_cases: int = 0    # cases tried while shrinking
    judged: int = 0
    skipped: dict = field(default_factory=dict)
    found_path: Path | None = None
    found_replay: str | None = None


@dataclass(frozen=True)
class _Failed:
    verdict: object
    case: object
    recipe: object  # the recipe, or (recipe, dO regime) for a backward test


def _strategy_options(preset, spec) -> dict:
    """The preset's strategy options, fitted to the spec where the preset cannot know it: single head dims
    the spec does not allow are left out (none left and no [D, Dv] pair: the spec's), and lengths reach the spec's
    ``seq_multiple``. A pair the spec forbids is an InvalidArgument."""
    options = preset.strategy_options()
    if options["head_dims"] is not None:
        options["head_dims"] = list(spec_choices(spec, options["head_dims"])) or None
    if options["max_n"] < spec.seq_multiple:
        options["max_n"] = spec.seq_multiple
    return options


class _PropertyTest:
    """One test id of a property test: its kernel, dtype, pass and device, and the body hypothesis drives."""

    def __init__(self, kern, dtype: str, device: str, session: Session, nodeid: str, *, backward: bool):
        self.kern, self.dtype, self.device, self.session = kern, dtype, device, session
        self.nodeid, self.backward = nodeid, backward
        self.run = _Run()

    def judge(self, recipe, upstream) -> None:
        run = self.run
        key = (recipe, upstream) if self.backward else recipe
        if run.shrinking and time.monotonic() > run.deadline:
            run.out_of_time(key)
            return
        verdict, case = self._check(recipe, upstream)
        if run.shrinking:
            run.shrink_cases += 1
        else:
            run.generated += 1
        rec = self.session.record(verdict, case, source="property_test", test=self.nodeid,
                                  phase="shrink" if run.shrinking else "generate",
                                  **({"pass": "backward"} if self.backward else {}))
        if verdict.skipped:
            kind = verdict.skipped.split(":")[0]
            run.skipped[kind] = run.skipped.get(kind, 0) + 1
            return
        run.judged += 1
        if verdict.status == "BUG":
            if not run.shrinking:  # saved the moment it fails: an interrupted shrink loses nothing
                run.deadline = time.monotonic() + SHRINK_SECONDS
                run.found_path, run.found_replay = save_failure(self.session, verdict, case, self.kern,
                                                                label="found", device=self.device)
                rec.update(saved=str(run.found_path), replay=run.found_replay)
            run.fail(key, _Failed(verdict, case, key))

    def _check(self, recipe, upstream):
        case = recipe.build(kernel=self.kern.name)
        if self.backward:
            case = backward_case(case, upstream=upstream, seed=recipe.seed)
            return check_backward(self.kern, case, device=self.device, exclusions=True), case
        return check(self.kern, case, device=self.device, properties=properties_for(recipe.seed)), case

    def given_args(self, strategy) -> dict:
        if not self.backward:
            return dict(recipe=strategy)
        return dict(recipe=strategy, upstream=st.sampled_from(sorted(UPSTREAM_REGIMES)))

    def hypothesis_test(self, given_args: dict, *, examples: int, seed: int | None, database, phases=None):
        if self.backward:
            def body(recipe, upstream):
                self.judge(recipe, upstream)
        else:
            def body(recipe):
                self.judge(recipe, None)

        verbosity = settings.default.verbosity if settings.default.verbosity > Verbosity.normal else Verbosity.quiet
        # the test id keys the database entries and the random stream
        return hypothesis_test(body, given_args=given_args, max_examples=examples, seed=seed, database=database,
                               phases=phases, verbosity=verbosity, digest=self.nodeid.encode())

    def run_all(self, strategy, pools: dict, *, examples: int, seed: int | None):
        """The covering order's cases first, each in an engine of its own (a failing one is shrunk
        there), then hypothesis's free drawing for the examples left; the outcome of the first failure."""
        given_args = self.given_args(strategy)
        drawn = st.fixed_dictionaries(given_args) if self.backward else strategy  # as the test draws them
        database = settings.default.database
        plan_seed = seed if seed is not None else random.randrange(2**32)
        planned = 0
        for i, cell in enumerate(covering_plan(pools, seed=plan_seed, limit=covering_size(pools, examples))):
            choices = planned_choices(drawn, pools, cell, seed=hash((plan_seed, i)))
            if choices is None:
                continue
            base = database if database is not None else InMemoryExampleDatabase()
            outcome = run_test(self.hypothesis_test(given_args, examples=1, seed=seed, phases=(Phase.reuse, Phase.shrink),
                                                    database=PlannedDatabase(base, choices.choices)), self.run)
            planned += 1
            if outcome.failure is not None:
                return outcome
        if examples <= planned:
            return Outcome()
        return run_test(self.hypothesis_test(given_args, examples=examples - planned, seed=seed, database=database),
                        self.run)


def _run_property_test(kern, dtype: str, options: _Options, nodeid: str, *, backward: bool = False) -> None:
    import pytest  # pytest is no dependency of flashcheck: only the test made here needs it

    session = active_session()
    if session is None:
        pytest.fail("flashcheck.property_test needs flashcheck's pytest plugin (it was disabled: drop "
                    "-p no:flashcheck, or add `pytest_plugins = ['flashcheck.plugin']` to a conftest.py)",
                    pytrace=False)
    register_profiles()
    preset = load_preset(session.option("preset", options.preset, DEFAULT_PRESET))
    examples = session.option("max_examples", options.max_examples)
    if examples is None:
        long_profile = settings.get_current_profile_name() == "flashcheck-long"
        examples = settings.default.max_examples if long_profile else preset.max_examples
    device = default_device(session, options.device)
    _skip_unless_runnable(kern, device)
    spec = kern.spec.for_backward() if backward else kern.spec  # a backward test skips the backward's defects
    sizes = _strategy_options(preset, spec)
    strategy = recipes(spec=spec, dtypes=[dtype], **sizes)
    test = _PropertyTest(kern, dtype, device, session, nodeid, backward=backward)
    with without_local_constants():
        outcome = test.run_all(strategy, recipe_pools(spec=spec, dtypes=[dtype], **sizes), examples=examples,
                               seed=session.option("seed", options.seed))
    if outcome.failure is not None:
        pytest.fail(_failure_message(session, kern, dtype, device, test.run, outcome.failure), pytrace=False)
    if test.run.judged == 0:
        why = ", ".join(f"{n} {k}" for k, n in sorted(test.run.skipped.items())) or "no case drawn"
        pytest.fail(f"flashcheck judged no case of {kern.name} ({dtype}): {why}. A test that judged "
                    "nothing is not a pass: check the spec, the preset and the device.", pytrace=False)


def _skip_unless_runnable(kern, device: str) -> None:
    import pytest  # pytest is no dependency of flashcheck: only the test made here needs it

    if device == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA GPU here (a GPU lane passes --flashcheck-require-gpu so that it cannot pass "
                        "by skipping; --flashcheck-device cpu runs on the CPU)")
    if device not in kern.spec.devices:
        pytest.skip(f"{kern.name} declares devices {kern.spec.devices}, and this run's device is {device}")


def _failure_message(session: Session, kern, dtype: str, device: str, run: _Run, failure: _Failed) -> str:
    first = run.first
    same = first is not None and failure.recipe == first.recipe
    if same:
        path, replay = run.found_path, run.found_replay
    else:
        path, replay = save_failure(session, failure.verdict, failure.case, kern, label="shrunk", device=device)
        for rec in reversed(session.records):  # the record of the shrunk case names its file too
            if rec.get("case") == failure.verdict.case and rec.get("status") == failure.verdict.status:
                rec.update(saved=str(path), replay=replay)
                break
    tried = counted(run.shrink_cases, "more case")
    if run.cut:
        how = f"case {run.generated} drawn, " + (f"shrunk over {tried}" if not same else f"{tried} tried") + \
              f" (shrinking stopped after {SHRINK_SECONDS:g} s)"
    elif not same:
        how = f"case {run.generated} drawn, shrunk over {tried}"
    else:
        how = f"case {run.generated} drawn (shrinking tried {tried}: none smaller fails)"
    what = f"{dtype}, backward" if isinstance(failure.recipe, tuple) else dtype
    lines = [f"flashcheck: {kern.name} ({what}, {device}) failed on {how}:", str(failure.verdict),
             f"drawn from: {failure.recipe!r}",
             f"saved: {display_path(path, session.invocation_dir)}"]
    if not same and run.found_path is not None:
        lines.append(f"first found as: {display_path(run.found_path, session.invocation_dir)}")
    lines.append(f"replay: {replay}")
    return "\n".join(lines)


