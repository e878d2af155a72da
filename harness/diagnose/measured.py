"""The person's own runs, pasted as a table that varies one setting and says which runs held and which died
("| MAX_SEQS | free after boot | one prompt |" then "| 12 | 416 MiB | ok |", "| 16 | 356 MiB | dead |"): the largest
value that held, below the smallest that died, is a measured answer, and it comes first. So is a value the person
says a run held at ("runs correctly only when set model_max_length = 256", "reduce context to 16K to make it work",
"with n_samples=512 it works"), where it lowers what was in place, and a code change or build the person says fixed it
or the run has failed since ("this PR resolves it", "hits OOM since 5/4/24")."""

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


# a setting a person may say a run held at, and its lever: a sequence or context length, a batch, a quantization
# tool's calibration samples (AutoAWQ n_samples / max_calib_samples, AutoRound and GPTQ's nsamples, llm-compressor's
# num_calibration_samples: all of them go through a layer's forward together), vLLM's running sequences
_SAID_SETTINGS = (
    (r"max_length|model_max_length|cutoff_len|max_seq_length|max_seq_len|seq_len|seqlen|seq_length|block_size|"
     r"max_model_len|num_ctx|ctx_size|context(?:[ _]length|[ _]size)?", "max_model_len_down"),
    (r"per_device_train_batch_size|micro_batch_size|batch_size|batch size", "batch_size_down"),
    (r"n_samples|nsamples|num_calibration_samples|max_calib_samples|num_samples", "batch_size_down"),
    (r"max_num_seqs", "max_num_seqs_down"),
)
_NAME = "|".join(name for name, _ in _SAID_SETTINGS).replace("_", "[_-]")
_HELD_VERB = r"(?:works?|worked|runs?|ran|fits?|fitted|starts?|started|succeed\w*|completes?|completed)"
_VALUE = r"[`'\"]?(?P<value>\d[\d,]*(?:\.\d+)?)\s*(?P<k>[kK]\b)?"
_SAID_HELD = (
    # "run_train.sh correctly only when set model_max_length = 256", "works if I set --max_length 2048"
    re.compile(rf"\b{_HELD_VERB}\b[^\n]{{0,40}}?\b(?:only\s+)?(?:when|if|with|after|once)\s+(?:I\s+|we\s+)?"
               rf"(?:set\w*|us(?:e|ing)|reduc\w*|lower\w*|chang\w*|add\w*)?\s*(?:the\s+)?[`'\"]?(?:--?)?"
               rf"(?P<name>{_NAME})[`'\"]?\s*(?:=|:|to|of|as)?\s*(?:from\s+\S+\s+to\s+)?{_VALUE}", re.I),
    # "reduce context to 16K to make it work", "lowering max_length to 1024, it runs"
    re.compile(rf"\b(?:reduc\w*|lower\w*|decreas\w*|set\w*|chang\w*)\s+(?:the\s+)?(?:--?)?(?P<name>{_NAME})\s+"
               rf"(?:from\s+\S+\s+)?to\s+{_VALUE}[^\n]{{0,30}}?(?:to make it work|\bit\s+{_HELD_VERB}\b)", re.I),
    # "when the `n_samples=512`, it works well"
    re.compile(rf"[`'\"]?(?:--?)?(?P<name>{_NAME})[`'\"]?\s*[=:]\s*{_VALUE}[`'\"]?[^\n]{{0,20}}?\bit\s+"
               rf"{_HELD_VERB}\b", re.I),
)
_NOT = re.compile(r"(?:\bnot\b|n't\b|\bnever\b|\bstill\b|\beven\b)[^\n]{0,15}$", re.I)


# the log says a named code change fixed the failure: a PR's own description ("this PR resolves it"), a release the
# person moved to ("using 0.6.1 fixed the issue", "after upgrading to 0.8.5 it works")
_FIX_NAMED = re.compile(r"\b(?:this|the|that)\s+(?:PR|pull request|patch|commit|change|fix|release)\b[^\n.]{0,30}?\b"
                        r"(?:resolves|fixes|fixed|solves|solved|removes|eliminates)\s+(?:it|this|that|the\s+"
                        r"(?:OOM|issue|problem|error|failure|crash))\b|"
                        r"\b(?:upgrad\w*|updat\w*|using|moving)\s+(?:to\s+)?(?:v(?:ersion)?\s*)?\d+\.\d+(?:\.\d+)?\S*"
                        r"\s+(?:fixed|solved|resolved)\s+(?:it|the\s+(?:issue|problem|OOM))", re.I)


def said_fixed_by_code(text: str) -> Change | None:
    """A code change or release the log says fixed the failure: upgrading to it comes first."""
    found = _FIX_NAMED.search(text)
    if found is None or _NOT.search(text[max(0, found.start() - 20):found.start()]):
        return None
    return Change("upgrade to the release that carries the fix the log names",
                  f"the log's own words: {found.group(0).strip()[:80]!r}", "upgrade")


# the log says the same run has failed since a development build it names by date or commit ("hits OOM since 5/4/24",
# "OOMs since commit ba561bf", "broken since nightly 20240504"): it fitted on the build before, so a build regressed,
# and its fix lands in a later build (a stable release's upgrade is not this: "since upgrading to 0.25.1" may be a
# change of defaults that a setting answers)
_REGRESSED_SINCE = re.compile(r"\b(?:OOM\w*|hits?\s+(?:an?\s+)?OOM|out of memory|fail\w*|broken|broke|regress\w*)"
                              r"[^\n.]{0,40}?\bsince\s+(?:\d{1,4}[/-]\d{1,2}(?:[/-]\d{2,4})?(?![\d/-])|"
                              r"(?:commit|build|nightly|container|image)\s+[\w.:/-]*\d|[0-9a-f]{7,40}\b)", re.I)


def said_regressed(text: str) -> Change | None:
    """A development build the log says the run has failed since: upgrading to the build that fixes the regression
    (or pinning the last good one) comes first."""
    found = _REGRESSED_SINCE.search(text)
    if found is None or _NOT.search(text[max(0, found.start() - 20):found.start()]):
        return None
    return Change("upgrade to the build that fixes the regression (or pin the last build that ran)",
                  f"the log's own words: {found.group(0).strip()[:80]!r}: the same run fitted on the build before",
                  "upgrade")


def said_to_hold(text: str) -> Change | None:
    """A value the person says a run held at, for a setting whose lower value is a lever."""
    for pattern in _SAID_HELD:
        for found in pattern.finditer(text):
            if _NOT.search(text[max(0, found.start() - 20):found.start()]):
                continue
            name = found.group("name")
            lever = next(lev for names, lev in _SAID_SETTINGS
                         if re.fullmatch(names.replace("_", "[_-]"), name, re.I))
            value = float(found.group("value").replace(",", "")) * (1024 if found.group("k") else 1)
            shown = f"{value:g}"
            return Change(f"{name} {shown}", f"the log's own words: a run held at {name} {shown} "
                          f"({found.group(0).strip()[:80]!r})", lever)
    return None


def measured_first(changes: tuple[Change, ...], text: str) -> tuple[Change, ...]:
    measured = measured_down(text) or said_to_hold(text) or said_fixed_by_code(text) or said_regressed(text)
    if measured is None:
        return changes
    return (measured,) + tuple(c for c in changes if c.lever != measured.lever)
