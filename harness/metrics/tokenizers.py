"""Tokenizers for ROUGE, and the CJK detection the metrics share.

rouge-score's default tokenizer keeps only `[a-z0-9]`, so Chinese text scores 0 even against itself.
`MixedTokenizer` splits CJK into single characters and hands every non-CJK run to rouge-score's
default tokenizer, in text order. On text without CJK it gives exactly the default's tokens.
"""

from __future__ import annotations

import re

# CJK ideographs (basic, extension A, compatibility, extensions B-F) and Japanese kana.
_CJK_CLASS = (
    "\u3040-\u30ff"  # hiragana, katakana
    "\u3400-\u4dbf"  # extension A
    "\u4e00-\u9fff"  # unified ideographs
    "\uf900-\ufaff"  # compatibility ideographs
    "\U00020000-\U0002ebef"  # extensions B-F
)
CJK_RE = re.compile(f"[{_CJK_CLASS}]")
_CJK_OR_RUN_RE = re.compile(f"[{_CJK_CLASS}]|[^{_CJK_CLASS}]+")

ZH_SHARE_THRESHOLD = 0.30  # language "auto": text is Chinese when CJK chars exceed this share


def has_cjk(text: str) -> bool:
    return CJK_RE.search(text) is not None


def cjk_share(text: str) -> float:
    """Share of CJK characters among letters and digits (whitespace and punctuation do not count)."""
    alnum = [ch for ch in text if ch.isalnum()]
    if not alnum:
        return 0.0
    return sum(1 for ch in alnum if CJK_RE.match(ch)) / len(alnum)


def detect_language(text: str) -> str:
    """'zh' when CJK characters exceed 30% of the letters and digits, else 'en'."""
    return "zh" if cjk_share(text) > ZH_SHARE_THRESHOLD else "en"


class RougeDefaultTokenizer:
    """rouge-score's own default tokenizer with the Porter stemmer, unchanged (the reference behaviour)."""

    name = "rouge-score default (Porter stemmer)"

    def __init__(self) -> None:
        # Imported here, not at module level: rouge-score imports nltk (about 2 s), which runs without ROUGE
        # (QA-only runs, every CLI start-up) should not pay.
        from rouge_score import tokenizers as rouge_tokenizers

        self._tokenizer = rouge_tokenizers.DefaultTokenizer(use_stemmer=True)

    def tokenize(self, text: str) -> list[str]:
        return self._tokenizer.tokenize(text)


class MixedTokenizer:
    """CJK characters as single tokens; Latin runs as rouge-score's default (lowercase, [a-z0-9], stemming)."""

    name = "char-cjk+word-latin"

    def __init__(self) -> None:
        self._latin = RougeDefaultTokenizer()

    def tokenize(self, text: str) -> list[str]:
        tokens: list[str] = []
        for match in _CJK_OR_RUN_RE.finditer(text):
            piece = match.group()
            if CJK_RE.match(piece):
                tokens.append(piece)
            else:
                tokens.extend(self._latin.tokenize(piece))
        return tokens


def rouge_tokenizer(language: str) -> RougeDefaultTokenizer | MixedTokenizer:
    """`en`: rouge-score's default exactly; `zh` and `auto`: the mixed tokenizer."""
    if language == "en":
        return RougeDefaultTokenizer()
    if language in ("zh", "auto"):
        return MixedTokenizer()
    raise ValueError(f"unknown language {language!r}; use en, zh or auto")
