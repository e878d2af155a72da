"""`quantgate` (and `python -m harness`): parse the command line, run a subcommand, map failures to exit codes.

Exit codes: 0 every candidate format is GO, 1 any is not (for `compare`: a regression), 2 bad usage or input,
3 internal error, 130 interrupted, 141 stdout closed early (`quantgate plan | head`: 128 + SIGPIPE, as a shell
reports any program killed by a closed pipe; nothing is printed).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys
import threading
from pathlib import Path

from harness import __version__, sandbox
from harness.commands import COMMANDS
from harness.plugins import load_plugins
from harness.errors import Terminated, UserError, interrupted_exit_code, raise_terminated

EXIT_PIPE_CLOSED = 128 + 13  # 128 + SIGPIPE
EXAMPLES = """examples:
  quantgate run --model ./my-model --evalsets ./evalsets --formats baseline,int8,awq --out runs/today
  quantgate plan --model ./my-model/config.json --target-gpu L4 --max-model-len 8192
  quantgate decide --baseline base.jsonl --candidate int8.jsonl
  quantgate compare runs/ --html trend.html
  quantgate report runs/today
  quantgate review runs/today --serve
  quantgate report runs/today --reviews runs/today/review-*.jsonl
  quantgate diagnose vllm.log --target-gpu L4
  quantgate evalsets check ./evalsets
  quantgate cache ls
  quantgate schema > report.schema.json

exit codes: 0 every candidate is GO, 1 one is not (compare: a regression), 2 bad input, 3 internal error,
130 interrupted, 143 terminated; `quantgate COMMAND --help` for each command's options."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quantgate", description="Decide whether a quantized LLM may ship.",
                                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
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


def console() -> None:
    """The `quantgate` command and `python -m harness`: main(), then the process's end. A process that was a Ray
    driver ends through harness.executors.ray.exit_after_ray (Ray's native destructors can hang it at exit);
    main() itself returns, for callers in the same process."""
    code = main()
    ray_executor = sys.modules.get("harness.executors.ray")
    if ray_executor is not None and ray_executor.DRIVER_RAN.is_set():
        ray_executor.exit_after_ray(code)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> int:
    try:
        code = _run(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()  # inside the try: a reader that went away shows here, not at interpreter exit
        return code
    except BrokenPipeError:  # stdout's reader closed it (`| head`): nobody is left to read, so end quietly
        _discard_stdout()
        return EXIT_PIPE_CLOSED


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that flushing what is still buffered at exit cannot fail a second time
    (the recipe of Python's signal module documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout has no file descriptor (replaced by a test, say): nothing to flush
        pass


def _run(argv: list[str]) -> int:
    debug = "--debug" in argv
    sandbox.apply_offline(os.environ)  # before any Hugging Face library is imported: they read it at import
    parser = build_parser()
    try:
        args = parse_args(parser, argv)
    except SystemExit as exc:  # argparse already printed the usage line; 2 for bad usage
        return int(exc.code or 0)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, raise_terminated) if on_main else None  # as Ctrl-C does
    try:
        return _command(args, debug)
    finally:
        if on_main:
            signal.signal(signal.SIGTERM, previous)


def _command(args: argparse.Namespace, debug: bool) -> int:
    try:
        sandbox.confine_process()
        load_plugins()
        return int(args.func(args))
    except UserError as exc:
        print(f"quantgate: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print(f"quantgate: {'terminated (SIGTERM)' if isinstance(exc, Terminated) else 'interrupted'}",
              file=sys.stderr)
        return interrupted_exit_code(exc)
    except BrokenPipeError:
        raise  # not an internal error: main() ends quietly
    except OSError as exc:
        if exc.errno != errno.ENOSPC or debug:
            raise
        print(f"quantgate: error: {disk_full_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - one readable line unless --debug
        if debug:
            raise
        print(f"quantgate: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 3


def disk_full_line(exc: OSError) -> str:
    """The file being written when the disk filled, and the room left where it lives."""
    import shutil

    where = Path(exc.filename) if exc.filename else Path.cwd()
    folder = next((p for p in (where, *where.parents) if p.is_dir()), Path("/"))
    free = shutil.disk_usage(folder).free
    needed = getattr(exc, "bytes_needed", None)
    room = f"{free / 2**20:,.0f} MiB free on {folder}" + (
        f", writing it needs {max(needed / 2**20, 0.01):,.2f} MiB" if needed else "")
    return (f"{exc.filename or 'a file'}: the disk is full ({room}); free some "
            "space (`quantgate cache ls` shows what the cache holds) and rerun with --resume: every stage already "
            "written is kept, each file is written whole or not at all")


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Like parser.parse_args, but an unknown argument is reported by the (sub)command it was given to, with that
    command's usage: `quantgate run: error: unrecognized arguments: --foo`, not the top-level usage."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        first_extra = min((i for i, arg in enumerate(argv) if arg in extras), default=len(argv))
        _owner(parser, args, argv, first_extra).error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def _owner(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str], position: int,
           start: int = 0) -> argparse.ArgumentParser:
    """The deepest (sub)command parser chosen before argv[position]: `cache ls --foo` -> `ls`, `--foo plan` -> the
    top-level one."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(args, action.dest, None)
            chosen = action.choices.get(name or "")
            at = argv.index(name, start) if chosen is not None and name in argv[start:] else None
            if at is not None and at < position:
                return _owner(chosen, args, argv, position, at + 1)
    return parser
