"""How problems and reports show a file: relative to the working directory when under it."""

from __future__ import annotations

from pathlib import Path


def display_path(path: Path | str) -> str:
    """Relative to the working directory when under it, else absolute."""
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(resolved)
