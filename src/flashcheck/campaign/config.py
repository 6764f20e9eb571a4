"""What a campaign is asked to do, as one frozen record: :class:`CampaignConfig`, passed whole from the
command line to :func:`flashcheck.campaign.run.run_campaign`, pickled to each ``--jobs`` worker, built
for each of a sign-off's campaigns.

Its parts say what to run (:class:`Target`), how long (:class:`Limits`), which cases (:class:`Drawing`),
where to save (:class:`Storage`) and how to run the kernel (:class:`Execution`). What the record can
check alone it checks when it is made (:meth:`CampaignConfig.__post_init__`); what needs the kernel
resolved is :func:`flashcheck.campaign.setup.prepare_campaign`'s. What a running campaign calls back
(progress, findings) and the worker process started early are not configuration: :class:`CampaignHooks`.

Nothing here imports torch or hypothesis: the ``--jobs`` parent builds its workers' configs before
either is imported.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import InvalidArgument
from ..inputs.presets import Preset

if TYPE_CHECKING:  # not at run time: flashcheck.contract.spec imports torch, and this module must not
    from ..contract.spec import Kernel

__all__ = ["CampaignConfig", "CampaignHooks", "Drawing", "Execution", "Limits", "Storage", "Target"]


@dataclass(frozen=True)
class Target:
    """What to run: ``kernel`` by name (a built-in or ``package.module:function``, resolved again in every
    process) or a :class:`~flashcheck.contract.spec.Kernel` (run in this process), a built-in's
    ``kernel_options``, the ``device``, the ``preset`` that draws the cases, the ``dtypes`` (default: the
    preset's, those the kernel supports) and the pass (``backward``)."""

    kernel: str | Kernel
    device: str
    preset: Preset
    dtypes: tuple | None = None
    kernel_options: dict | None = None
    backward: bool = False

    @property
    def by_name(self) -> bool:
        """Whether the kernel is named, so that another process can resolve it."""
        return isinstance(self.kernel, str)


@dataclass(frozen=True)
class Limits:
    """How long: ``max_examples`` drawn cases and ``time_budget`` seconds (None: the preset's), past the
    first bug with ``keep_going``."""

    max_examples: int | None = None
    time_budget: float | None = None
    keep_going: bool = False


@dataclass(frozen=True)
class Drawing:
    """Which cases: ``seed`` fixes them (None: new ones each time); ``reuse=False`` leaves out hypothesis's
    replay of the example database (still written), so that the seed alone fixes the cases (``--jobs``);
    ``plan``: this campaign's part of a covering plan others share, as the fields of a
    :class:`~flashcheck.inputs.covering.PlanShare` (which imports hypothesis; None: a plan of its own)."""

    seed: int | None = None
    reuse: bool = True
    plan: tuple | None = None


@dataclass(frozen=True)
class Storage:
    """Where to save: failing cases in ``corpus`` (and hypothesis's examples there, unless ``database``, a
    folder or ``redis://HOST:PORT[/DB]``); ``records``: one row per drawn, judged case in the summary."""

    corpus: str | Path = "flashcheck-corpus"
    database: str | Path | None = None
    records: bool = False


@dataclass(frozen=True)
class Execution:
    """How to run the kernel: in a worker process (``isolate``, a kernel given by name), restarted whenever it
    dies or hangs past ``case_timeout`` seconds (default
    :func:`~flashcheck.campaign.worker.default_case_timeout`; checked by the worker), or in this one."""

    isolate: bool = True
    case_timeout: float | None = None


@dataclass(frozen=True)
class CampaignConfig:
    """One campaign. ``started_at`` (a ``time.monotonic()`` value; None: when it starts) is what the
    summary's ``first_case_s`` counts from."""

    target: Target
    limits: Limits = Limits()
    drawing: Drawing = Drawing()
    storage: Storage = Storage()
    execution: Execution = Execution()
    started_at: float | None = None

    def __post_init__(self):
        if self.target.kernel_options and not self.target.by_name:
            raise InvalidArgument("kernel_options", self.target.kernel_options, "options are for a kernel given by "
                                  "name", "Pass the kernel's name, or bind the options in the kernel itself.")
        timeout = self.execution.case_timeout
        if timeout is not None and not self.isolated:
            raise InvalidArgument("case_timeout", timeout, "only a worker process can be stopped when a case "
                                  "hangs, and this kernel runs in-process",
                                  "Pass the kernel by name with isolate=True (CLI: drop --no-isolation), or drop "
                                  "the timeout.")

    @property
    def isolated(self) -> bool:
        """Whether the kernel runs in a worker process: asked for, and named (an object cannot be resolved
        again in another process)."""
        return self.execution.isolate and self.target.by_name

    @property
    def max_examples(self) -> int:
        return self.limits.max_examples or self.target.preset.max_examples

    @property
    def time_budget(self) -> float | None:
        budget = self.limits.time_budget
        return budget if budget is not None else self.target.preset.time_budget

    def replace(self, **parts) -> "CampaignConfig":
        """This config with some of its parts' fields changed: ``replace(seed=1, corpus="c")``."""
        changed = {}
        for part in ("target", "limits", "drawing", "storage", "execution"):
            record = getattr(self, part)
            mine = {f.name: parts.pop(f.name) for f in dataclasses.fields(record) if f.name in parts}
            if mine:
                changed[part] = dataclasses.replace(record, **mine)
        return dataclasses.replace(self, **changed, **parts)


@dataclass(frozen=True)
class CampaignHooks:
    """What a running campaign calls back, and a worker process started before the config was known: none
    of it crosses to another process. ``progress(result)`` after each case; ``on_finding(entry)`` with each
    finding's summary entry once its case is saved; ``worker_process``, started before this process
    imported torch, becomes the kernel's worker (it is closed when the campaign ends, used or not)."""

    progress: Callable | None = None
    on_finding: Callable | None = None
    worker_process: object = None  # a flashcheck.campaign.worker.WorkerProcess
