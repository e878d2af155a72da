"""Errors the user can act on. The CLI prints them as one line and exits 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """Bad usage or bad input: message names the file/line/field and what to do."""

    exit_code = 2

    def __init__(self, message: str, *, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []

    def __str__(self) -> str:  # one readable line, then one line per extra problem
        head = super().__str__()
        if not self.problems:
            return head
        return head + "".join(f"\n  - {p}" for p in self.problems)


class Terminated(KeyboardInterrupt):
    """SIGTERM (what CI runners and Kubernetes send on a timeout), raised where a Ctrl-C would be so that a run
    stops the same way: finished stages kept, a partial report, workers and servers stopped; exit 143, not 130."""

    exit_code = 143


def interrupted_exit_code(exc: KeyboardInterrupt) -> int:
    """143 for SIGTERM (Terminated), 130 for Ctrl-C: 128 + the signal's number, as shells report them."""
    return getattr(exc, "exit_code", 130)


def raise_terminated(signum, frame) -> None:
    raise Terminated()


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """" (did you mean 'x'?)" for the closest of `known` to a misspelled `word`; "" when none is close."""
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""
