"""The person's own runs, pasted as a table that varies one setting and says which runs held and which died
("| MAX_SEQS | free after boot | one prompt |" then "| 12 | 416 MiB | ok |", "| 16 | 356 MiB | dead |"): the largest
value that held, below the smallest that died, is a measured answer, and it comes first."""

from __future__ import annotations

import re

from harness.diagnose.records import Change

_HEADER = re.compile(r"^\|\s*[`*]*\s*([A-Za-z][\w.-]*)\s*[`*]*\s*\|.*\|\s*$")
_ROW = re.compile(r"^\|\s*[`*]*\s*(\d+(?:\.\d+)?)\s*[`*]*\s*\|(.*)\|\s*$")
_HELD = re.compile(r"(?<![\w-])(?:ok|works?|worked|pass(?:ed|es)?|fine|fits?|served|success\w*)(?![\w-])|✓|✅", re.I)
_DIED = re.compile(r"(?<![\w-])(?:dead|died|oom\w*|out of memory|fail\w*|crash\w*|error)(?![\w-])|✗|❌", re.I)
# a setting a table's first column may name, and the change that moves it down (vLLM's spelling, the engine the
# corpus's tables come from; a batch size in any framework's words)
_SETTINGS = (
    (re.compile(r"^(?:max[_-]?(?:num[_-]?)?seqs|max_num_seqs)$", re.I), "--max-num-seqs", "max_num_seqs_down"),
    (re.compile(r"^(?:max[_-]?model[_-]?len)$", re.I), "--max-model-len", "max_model_len_down"),
    (re.compile(r"^(?:gpu[_-]?memory[_-]?utili[sz]ation|mem[_-]?util)$", re.I), "--gpu-memory-utilization",
     "gpu_memory_utilization_down"),
    (re.compile(r"^(?:batch[_-]?size|bs|per_device_train_batch_size)$", re.I), "batch size",
     "batch_size_down"),
)


def measured_down(text: str) -> Change | None:
    """A table whose first column is a known setting and whose rows say held or died: the largest value that held,
    where it is below the smallest value that died (the setting goes down to what the person measured)."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        header = _HEADER.match(line.strip())
        if header is None:
            continue
        setting = next(((flag, lever) for pattern, flag, lever in _SETTINGS if pattern.match(header.group(1))), None)
        if setting is None:
            continue
        held, died = [], []
        for row in lines[index + 1:]:
            row = row.strip()
            if re.fullmatch(r"\|[\s|:-]*\|", row):
                continue
            found = _ROW.match(row)
            if found is None:
                break
            value, rest = float(found.group(1)), found.group(2)
            said_died, said_held = bool(_DIED.search(rest)), bool(_HELD.search(rest))
            if said_died and not said_held:
                died.append(value)
            elif said_held and not said_died:
                held.append(value)
        below = [v for v in held if died and v < min(died)]
        if not below:
            continue
        best = max(below)
        shown = f"{best:g}"
        flag, lever = setting
        return Change(f"{flag} {shown}" if flag.startswith("--") else f"lower the {flag} to {shown}",
                      f"the log's own runs: {', '.join(f'{v:g}' for v in sorted(held))} held and "
                      f"{', '.join(f'{v:g}' for v in sorted(died))} died, so {shown} is the largest measured to hold",
                      lever)
    return None


def measured_first(changes: tuple[Change, ...], text: str) -> tuple[Change, ...]:
    measured = measured_down(text)
    if measured is None:
        return changes
    return (measured,) + tuple(c for c in changes if c.lever != measured.lever)
