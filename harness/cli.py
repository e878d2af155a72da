"""`quantgate` (and `python -m harness`): parse the command line, run a subcommand, map failures to exit codes.

Exit codes: 0 every candidate format is GO, 1 any is not, 2 bad usage or input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from harness import __version__, sandbox
from harness.commands import COMMANDS
from harness.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quantgate", description="Decide whether a quantized LLM may ship.")
    parser.add_argument("--version", action="version", version=f"quantgate {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"harness.commands.{name}").add_parser(subparsers)
    _accept_debug_after_subcommands(parser)
    return parser


def _accept_debug_after_subcommands(parser: argparse.ArgumentParser) -> None:
    """`quantgate run ... --debug` works like `quantgate --debug run ...` (main() reads it from argv)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
                _accept_debug_after_subcommands(sub)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    sandbox.apply_offline(os.environ)  # before any Hugging Face library is imported: they read it at import
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage line; 2 for bad usage
        return int(exc.code or 0)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        sandbox.confine_process()
        return int(args.func(args))
    except UserError as exc:
        print(f"quantgate: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("quantgate: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one readable line unless --debug
        if debug:
            raise
        print(f"quantgate: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 3
