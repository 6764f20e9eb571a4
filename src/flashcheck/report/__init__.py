"""Sign-off reports: ``flashcheck signoff`` runs the campaigns and writes ``report.json`` (a versioned,
documented schema: ``schema.json``), ``report.md`` and a self-contained ``index.html``; ``flashcheck
report`` re-renders one and compares several.

    machine    what ran: GPU, driver, CUDA, cuDNN, torch, triton, flashcheck's version and commit
    model      report.json from the campaigns' summaries: SIGNED-OFF or BLOCKED per kernel, pass, dtype
    plots      matplotlib figures as PNG bytes
    render     Markdown and HTML from one list of blocks
    compare    reports side by side
    signoff    the campaigns, then the report
"""

from .model import BLOCKED, SCHEMA_VERSION, SIGNED_OFF, build_report, load_report, schema
from .render import write_report

__all__ = ["BLOCKED", "SCHEMA_VERSION", "SIGNED_OFF", "build_report", "load_report", "run_signoff", "schema",
           "write_comparison", "write_report"]


def __getattr__(name):
    if name == "run_signoff":
        from .signoff import run_signoff  # the campaigns (torch): a report renders without torch

        return run_signoff
    if name == "write_comparison":
        from .compare import write_comparison  # matplotlib, only when asked for

        return write_comparison
    raise AttributeError(name)
