"""The one command-line flag reader: `--flag value`, `--flag=value` and bare `--switch` pairs from a command's
words (the served block's flags, the planners' printed commands, the commands `quantgate diagnose` reads)."""

from __future__ import annotations

import shlex


def command_words(text: str) -> list[str]:
    """A command line's words as a shell splits them; plain whitespace where its quotes do not pair (a log line)."""
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def flag_pairs(words: list[str] | tuple[str, ...], *, strict: bool = False) -> list[tuple[str, str]]:
    """(flag, value) in order, "" for a bare switch; a word after a flag is its value unless it is a flag itself.
    strict: a word that is neither a flag nor a flag's value is a ValueError (a printed command must have none);
    otherwise such words (the program, a model path, the text around a command) are skipped."""
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--") or word == "--":
            if strict:
                raise ValueError(f"{word!r} is not a flag")
            i += 1
            continue
        if "=" in word:
            flag, _, value = word.partition("=")
            pairs.append((flag, value))
            i += 1
            continue
        has_value = i + 1 < len(words) and not words[i + 1].startswith("--")
        pairs.append((word, words[i + 1] if has_value else ""))
        i += 2 if has_value else 1
    return pairs
