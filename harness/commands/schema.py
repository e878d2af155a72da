"""`quantgate schema`: print the JSON Schema of report.json (docs/report.schema.json is a copy of it)."""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "schema",
        help="print the JSON Schema of report.json",
        description="Print the JSON Schema (draft 2020-12) of the report.json that `quantgate run` writes, with "
                    "every field's meaning and unit; docs/report.md explains the fields, docs/report.schema.json "
                    "is this output.",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.report.schema import schema_text

    sys.stdout.write(schema_text())
    return 0
