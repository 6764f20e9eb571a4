"""``flashcheck replay``: re-run one saved case on the kernel it was found with (or ``--kernel``); a
backward case re-runs the backward pass, with the dO regime and seed it failed with."""

from __future__ import annotations

import os

from .options import add_device, add_json, choose_device, exit_status, write_json_or_usage

__all__ = ["add_parser", "replay_kernel", "run"]


def add_parser(subparsers) -> None:
    replay = subparsers.add_parser("replay", help="re-run one saved case (a backward case re-runs the backward pass)")
    replay.set_defaults(run=run)
    replay.add_argument("case", help="a saved case (.json, .npz or their common stem)")
    replay.add_argument("--kernel", default=None, help="another kernel than the one that produced the case")
    add_device(replay)
    add_json(replay, help="write the verdict here as JSON")


def run(args) -> int:
    """The case's verdict, printed and written, with the defect models' line for a numerical BUG and a quantized
    case's quantization error; exit 1 for a BUG (a single case is never NO_CASES)."""
    # on first use: every command module loads at start-up
    from ..defects.naming import explained_verdict
    from ..files import check_writable_file
    from ..inputs.case import AttentionCase
    from ..inputs.quantization_error import quantization_error
    from ..judge.backward import check_backward, is_backward_case
    from ..judge.check import check

    check_writable_file("--json", args.json)
    case = AttentionCase.load(args.case)
    device = choose_device(args.device)
    kernel = replay_kernel(args.case, case.provenance or {}, args.kernel, device)
    if is_backward_case(case):  # its provenance names the dO regime and seed it failed with
        verdict = check_backward(kernel, case, device=device)
    else:
        verdict = check(kernel, case, device=device)
    print(verdict)
    model = explained_verdict(kernel, case, verdict, device=device)
    if model is not None:
        print(model.line())
    quantization = quantization_error(case, kernel.spec.quantization)
    if quantization is not None:
        print(quantization.text())
    written = {**verdict.as_dict(), "model": None if model is None else model.as_dict(),
               "quantization_error": None if quantization is None else quantization.as_dict()}
    return write_json_or_usage(args.json, written) or exit_status(verdict.status)


def replay_kernel(case_path: str, provenance: dict, override: str | None, device: str):
    """The kernel the case saved at ``case_path`` replays on: ``--kernel``, else the one it was found with,
    reached as the user named it (import path or built-in name with options), whatever its display name is."""
    # on first use: every command module loads at start-up
    from ..errors import InvalidArgument
    from ..kernels.origin import importable_from
    from ..kernels.registry import resolve_kernel

    shown, source = provenance.get("kernel"), provenance.get("kernel_source")
    name = override or source or shown
    if not name:
        raise InvalidArgument("CASE", case_path, "the saved case does not name its kernel",
                              "Pass --kernel NAME to choose the kernel to replay it on.")
    importable_from([os.getcwd(), provenance.get("kernel_import_root")])
    try:
        kernel = resolve_kernel(name, device=device)
    except InvalidArgument as exc:
        if override:
            raise
        why = "the case was saved before cases recorded their kernel's import path, and its kernel's display " \
            "name" if not source else "the kernel the case was found with"
        raise InvalidArgument("--kernel", name, f"{why} {name!r} cannot be loaded here ({getattr(exc, 'problem', exc)})",
                              "Pass --kernel with the kernel's import path, as given to flashcheck fuzz "
                              "(e.g. --kernel mymodule:attention), from the folder it imports from.") from None
    if override and (source or shown):
        _note_dropped_options(source or shown, kernel.name)
    elif shown and shown != kernel.name:
        print(f"kernel {shown} (reached as {name})")
    return kernel


def _note_dropped_options(recorded: str, chosen: str) -> None:
    """Say so when ``--kernel`` names the case's kernel without the options it was found with."""
    # on first use: every command module loads at start-up
    from ..kernels.registry import parse_kernel_name

    (base, mutant, had), (base2, mutant2, has) = parse_kernel_name(recorded), parse_kernel_name(chosen)
    changed = [f"{k}={v}" for k, v in had.items() if has.get(k) != v]
    if (base, mutant) == (base2, mutant2) and changed:
        print(f"note: the case was found with {recorded}; --kernel runs {chosen}, without "
              f"{', '.join(changed)}. Pass --kernel '{recorded}' to replay it as found.")

