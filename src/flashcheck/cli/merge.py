"""``flashcheck merge``: the ``--json`` summaries of campaigns run side by side, combined into one
(:func:`flashcheck.campaign.combine.combine_summaries`)."""

from __future__ import annotations

from .options import add_json, exit_status, write_json_or_usage
from .summary import print_summary

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    merge = subparsers.add_parser("merge", help="merge the --json summaries of campaigns run side by side into one")
    merge.set_defaults(run=run)
    merge.add_argument("summaries", nargs="+", metavar="SUMMARY", help="JSON summaries written by fuzz --json")
    add_json(merge, help="write the merged summary here")


def run(args) -> int:
    """The combined summary, printed and written; the exit status of its verdict, as for one campaign."""
    # on first use: every command module loads at start-up
    from ..campaign.combine import combine_summaries
    from ..campaign.summary import load_summary
    from ..files import check_writable_file

    check_writable_file("--json", args.json)
    combined = combine_summaries([load_summary(p) for p in args.summaries], sources=args.summaries).as_dict()
    print(f"flashcheck merge of {len(args.summaries)} summaries:")
    print_summary(combined, args.json)
    return write_json_or_usage(args.json, combined) or exit_status(combined["verdict"])
