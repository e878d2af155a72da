"""`quantgate evalsets check PATH...`: load and validate evalsets without a model."""

from __future__ import annotations

import argparse
import sys

from harness.errors import UserError
from harness.evalsets import display_path, load_evalsets


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("evalsets", help="work with evaluation sets")
    actions = parser.add_subparsers(dest="evalsets_action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="validate evalsets (specs, directories of specs, or bare data files) and list them",
        description="Load every set as a run would, without a model; print one line per set, or every problem.",
    )
    check.add_argument("paths", nargs="+", metavar="PATH",
                       help="a spec (.toml), a directory of specs, or a data file (.jsonl/.json/.csv/.parquet)")
    check.add_argument("--allow-outside-paths", action="store_true", help="let specs name data and calibration "
                       "files outside their own directory (refused by default)")
    check.set_defaults(func=run)


def describe(evalset) -> str:
    unanswerable = sum(1 for item in evalset.items if evalset.task == "qa" and not item.answers)
    count = f"{len(evalset.items)} items" + (f" ({unanswerable} unanswerable)" if unanswerable else "")
    source = display_path(evalset.spec_path or evalset.data_path)
    return (f"{evalset.name}: {evalset.task}, {evalset.language}, {count}, metrics {','.join(evalset.metrics)} "
            f"(gate {','.join(evalset.gate)}) [{source}]")


def run(args: argparse.Namespace) -> int:
    try:
        evalsets = load_evalsets(args.paths, allow_outside_paths=args.allow_outside_paths)
    except UserError as error:
        print(f"quantgate: error: {error}", file=sys.stderr)
        return error.exit_code
    for evalset in evalsets:
        print(describe(evalset))
    return 0
