"""``flashcheck repro``: turn one saved case into an upstream bug report that needs no flashcheck: ``repro.py`` (the
kernel's call, a float64 reference and the comparison with each element's budget from flashcheck's error model),
``repro.npz`` (the tensors the script reads: the inputs bit for bit and the budgets) and ``ISSUE.md``. The script of a
saved merge case (``flashcheck.check_merge(..., save_dir=...)``) calls its merge. The case is replayed first, as
``flashcheck replay`` does, for the kernel's output and the diagnosis; a replay that is not a BUG here is said so,
and the files are written anyway."""

from __future__ import annotations

from .options import add_device, choose_device
from .replay import replay_kernel

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    repro = subparsers.add_parser("repro", help="write a self-contained reproducer (repro.py) and an issue body "
                                  "(ISSUE.md) for a saved case")
    repro.set_defaults(run=run)
    repro.add_argument("case", metavar="CASE", help="a saved case (.json, .npz or their common stem)")
    repro.add_argument("--out", required=True, metavar="DIR", help="the folder to write repro.py and ISSUE.md in")
    repro.add_argument("--kernel", default=None, help="another kernel than the one that produced the case (for "
                       "saved merge states: another merge, module:function)")
    add_device(repro)


def run(args) -> int:
    """Write the reproducer and the issue; exit 0 once written (the replay's verdict is printed, not the status)."""
    # on first use: every command module loads at start-up
    from ..files import check_writable_folder, write_bytes, write_text
    from ..judge.verdict import BUG
    from ..repro.arrays import TensorFile

    _check_case("CASE", args.case)
    out = check_writable_folder("--out", args.out)
    device = choose_device(args.device)
    made = _made(args, device)
    write_bytes(out / TensorFile.NAME, made.tensors)
    write_text(out / "repro.py", made.script)
    write_text(out / "ISSUE.md", made.issue)
    print(made.verdict)
    if made.model is not None:
        print(made.model.line())
    if made.verdict.status != BUG:
        print(f"note: flashcheck's replay here ({device}) is {made.verdict.status}, not BUG: the defect may need the "
              "GPU it was found on; the reproducer is written anyway, and ISSUE.md says so.")
    if made.evidence.unchecked:
        print(f"note: the reproducer checks the output against its budget, not {', '.join(made.evidence.unchecked)}")
    files = [out / name for name in ("repro.py", "ISSUE.md", TensorFile.NAME)]
    print(f"wrote {', '.join(map(str, files))}; run: python {out / 'repro.py'}")
    return 0


def _made(args, device: str):
    """The reproducer of a saved attention case on its kernel, or of a saved merge case on its merge (--kernel
    overrides either)."""
    # on first use: every command module loads at start-up
    from ..inputs.case import AttentionCase
    from ..inputs.casefile import MERGE_FORMAT_NAME, saved_format
    from ..repro import make_repro

    if saved_format(args.case) == MERGE_FORMAT_NAME:
        # only for a saved merge case
        from ..inputs.merge_case import load_merge_case
        from ..repro.merge import merge_repro

        return merge_repro(load_merge_case(args.case), merge=args.kernel, device=device, case_path=args.case)
    case = AttentionCase.load(args.case)
    # The kernel as replay reaches it (import path or built-in with options; --kernel overrides).
    kernel = replay_kernel(args.case, case.provenance or {}, args.kernel, device)
    return make_repro(kernel, case, device=device, case_path=args.case)


def _check_case(option: str, value: str) -> None:
    """A missing case is a usage error that names the argument, before any output folder is made."""
    # on first use: every command module loads at start-up
    from ..errors import InvalidArgument
    from ..inputs.casefile import case_paths

    npz, json_path = case_paths(value)
    missing = [str(p) for p in (json_path, npz) if not p.is_file()]
    if missing:
        raise InvalidArgument(option, value, f"no saved case there ({' and '.join(missing)} not found)",
                              "Pass the .json, the .npz or the common stem of a case that flashcheck fuzz saved "
                              "(--corpus DIR), or that a failing test printed.")
