"""Errors the user can act on. The CLI prints them as one line and exits 2."""

from __future__ import annotations


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
