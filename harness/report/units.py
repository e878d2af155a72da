"""Human-readable numbers shared by the Markdown and HTML reports.

Every function takes the raw value from report.json (possibly None, since failed
formats leave fields they could not measure null) and returns display text.
"""

from __future__ import annotations

import re
from typing import Any

from harness.units import DASH, MINUS, format_bytes, format_ms, format_number, format_signed, is_number

__all__ = ["DASH", "MINUS", "clip", "excerpt", "fmt_bytes", "fmt_int", "fmt_interval", "fmt_ms",
           "fmt_num", "fmt_signed", "is_number", "prompt_excerpt"]


# The report's names for the shared formatters, at their defaults: "—" for a missing value, 1536 -> "1.5 KiB",
# 14.2e9 -> "13.22 GiB", 1500 ms -> "1.50 s", a delta "+0.5" / "−1.2" / "0.0".
fmt_bytes = format_bytes
fmt_ms = format_ms
fmt_num = format_number
fmt_signed = format_signed


def fmt_interval(delta: Any, low: Any, high: Any) -> str:
    """'−1.2 [−3.0, +0.5]': a delta and its interval; the delta alone when there is no interval."""
    if is_number(low) and is_number(high):
        return f"{fmt_signed(delta)} [{fmt_signed(low)}, {fmt_signed(high)}]"
    return fmt_signed(delta)


def fmt_int(value: Any) -> str:
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
