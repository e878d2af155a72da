"""Human-readable bytes, durations and numbers: the one formatter every layer uses.

The reports, the verdict reasons (harness/decide.py), the OOM reasons, `quantgate plan`
and scripts/gpu_check/ all format through here, each with its own defaults for what a missing value reads as
and how many decimals a size gets. Imports nothing from harness, so any module can import it.
"""

from __future__ import annotations

import math
import re
from typing import Any

DASH = "—"
MINUS = "\u2212"  # a real minus sign, so "−1.2" does not read as a hyphen

_BINARY_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool): what can be shown as a figure."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def format_bytes(value: Any, *, missing: str = DASH, digits: int | None = None, smallest: str = "B",
                 byte_unit: str = "B", from_fraction: float = 1.0) -> str:
    """Binary units, as GPU memory is sold and reported: 1536 -> '1.5 KiB', 14.2e9 -> '13.22 GiB', 100 -> '100 B'.

    `digits`: decimals for every unit (default: 2 for GiB, 1 below). `smallest`: the smallest unit used, "B",
    "KiB" or "MiB" (with "MiB", 500 bytes read '0.0 MiB'). `byte_unit`: the word for plain bytes ("bytes" to
    match PyTorch's OOM messages). `missing`: the text for None or anything that is not a finite number.
    `from_fraction`: a unit is used from this share of it on (0.1: 0.5 GiB reads '0.50 GiB', not '512.0 MiB').
    """
    if not is_number(value):
        return missing
    size = float(value)
    for unit, scale in _BINARY_UNITS:
        if abs(size) >= from_fraction * scale or unit == smallest:
            places = digits if digits is not None else (2 if unit == "GiB" else 1)
            return f"{size / scale:.{places}f} {unit}"
    return f"{int(size)} {byte_unit}"


def format_ms(value: Any, *, missing: str = DASH, seconds: bool = True, digits: int = 1) -> str:
    """12.34 -> '12.3 ms'; 1500 -> '1.50 s' (with seconds=False, '1500.0 ms'). `digits`: decimals of a figure
    in ms (2 for per-token times on a GPU: '0.84 ms')."""
    if not is_number(value):
        return missing
    if seconds and value >= 1000:
        return f"{value / 1000:.2f} s"
    return f"{value:.{digits}f} ms"


def format_number(value: Any, digits: int = 1, *, missing: str = DASH) -> str:
    """`digits` decimals with a real minus sign; a value that rounds to zero has none ('0.0', not '−0.0')."""
    if not is_number(value):
        return missing
    text = f"{value:.{digits}f}"
    if float(text) == 0:
        text = text.lstrip("-")
    return text.replace("-", MINUS)


def format_signed(value: Any, digits: int = 1, *, missing: str = DASH, plus_zero: bool = False) -> str:
    """+0.5 / −1.2: a delta shows its sign. One that rounds to zero reads '0.0', or '+0.0' with plus_zero."""
    text = format_number(value, digits, missing=missing)
    if not is_number(value) or text.startswith(MINUS) or (float(text) == 0 and not plus_zero):
        return text
    return "+" + text


def format_interval(delta: Any, low: Any, high: Any) -> str:
    """'−1.2 [−3.0, +0.5]': a delta and its interval; the delta alone when there is no interval."""
    if is_number(low) and is_number(high):
        return f"{format_signed(delta)} [{format_signed(low)}, {format_signed(high)}]"
    return format_signed(delta)


def format_int(value: Any) -> str:
    if not is_number(value):
        return DASH
    return f"{int(value):,}"


def excerpt(text: Any, limit: int, head_share: float = 0.4) -> str:
    """Shorten to about `limit` characters keeping head and tail, cutting the middle."""
    if text is None:
        return ""
    text = str(text)
    if len(text) <= limit:
        return text
    if limit < 8:
        return text[:limit] + "…"
    head = int(limit * head_share)
    tail = limit - head - 3
    return f"{text[:head].rstrip()} … {text[len(text) - tail:].lstrip()}"


def clip(text: Any, limit: int) -> str:
    """Shorten to `limit` characters from the start (one-line fields: errors, flags, hashes)."""
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


# ChatML / Llama-3 style control tokens (<|im_start|>, <|eot_id|>): noise in an excerpt
_CHAT_TOKEN = re.compile(r"<\|[A-Za-z0-9_]{1,40}\|>")


def prompt_excerpt(prompt: Any, limit: int) -> str:
    """A rendered prompt on one line without chat control tokens, tail-heavy.

    Prompts open with the same boilerplate instruction and end with the item's own
    context and question, so the end is what tells items apart.
    """
    text = " ".join(_CHAT_TOKEN.sub(" ", "" if prompt is None else str(prompt)).split())
    return excerpt(text, limit, head_share=0.2)
