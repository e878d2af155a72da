"""`quantgate diagnose` graded on real failure logs from public issues (tests/fixtures/diagnose_corpus/*.json, each
with the fix its thread confirmed): never "fits" on a failed log, no suggestion already in place, no crash, each
engine's log read by its own reader, and over the corpus the first change is a confirmed lever in >= 85%.

`python -m tests.test_diagnose_corpus --write-docs` writes the graded table into docs/troubleshooting.md."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.diagnose.advise import Context, NotADiagnosableLog, diagnose_all
from harness.diagnose.failures import failure_lines
from harness.diagnose.levers import in_place
from harness.diagnose.settings import settings_given

CORPUS = Path(__file__).parent / "fixtures" / "diagnose_corpus"
# logs the readers were never tuned on (tests/fixtures/diagnose_holdout/README.md): every rule but the share holds
HOLDOUT = Path(__file__).parent / "fixtures" / "diagnose_holdout"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "troubleshooting.md"
FIRST_CHANGE_RIGHT = 0.85
OTHER = "other"  # the lever id of a fix outside the corpus README's lever table
READER_OF = {"vllm": "vllm", "sglang": "sglang", "tgi": "tgi", "trtllm": "trtllm", "tensorrt-llm": "trtllm",
             "tensorrt_llm": "trtllm"}  # any other engine (PyTorch, transformers, lm-eval, ...): a non-engine reader
TABLE_BEGIN = "<!-- diagnose corpus table: begin -->"
TABLE_END = "<!-- diagnose corpus table: end -->"


def cases(folder: Path = CORPUS) -> list[dict]:
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(folder.glob("*.json"))]


def flags_text(flags: dict) -> str:
    """A case's flags as a user would pass them to --flags: '--key value', a bare switch, KEY=VALUE for ENV:KEY."""
    words = []
    for key, value in (flags or {}).items():
        if key.startswith("ENV:"):
            words.append(f"{key[4:]}={value}")
        elif value is True:
            words.append(key if key.startswith("-") else f"--{key}")
        elif value not in (False, None):
            words.append(f"{key if key.startswith('-') else '--' + key} {value}")
    return " ".join(words)


@dataclass(frozen=True)
class Graded:
    case: dict
    diagnoses: tuple
    error: str = ""

    @property
    def first(self):
        main = self.diagnoses[0] if self.diagnoses else None
        return main.changes[0] if main is not None and main.changes else None

    @property
    def right(self) -> bool:
        """The first change's lever is one the thread confirmed. `other` ("a fix outside the list; the setup says
        which") is never right: two `other`s need not be the same fix, and nothing here could check that they are."""
        lever = self.first.lever if self.first is not None else None
        return lever is not None and lever != OTHER and lever in self.case["confirmed_levers"]


def grade(case: dict, with_flags: bool) -> Graded:
    """with_flags: the case's flags as --flags and its engine as --engine, as a user who knows them passes them."""
    engine = READER_OF.get(case["engine"].lower()) if with_flags else None
    context = Context(flags_text=flags_text(case.get("flags")) if with_flags else "", engine=engine)
    try:
        return Graded(case, tuple(diagnose_all(case["log"], case["id"], context)))
    except NotADiagnosableLog as exc:
        return Graded(case, (), str(exc))


CASES = cases()
IDS = [c["id"] for c in CASES]
HELD_OUT = cases(HOLDOUT)
EVERY = CASES + HELD_OUT  # the rules that hold for every log: never fits, nothing in place, no crash, own reader
EVERY_ID = IDS + [f"holdout:{c['id']}" for c in HELD_OUT]


@pytest.mark.parametrize("with_flags", [False, True], ids=["log only", "with --flags"])
@pytest.mark.parametrize("case", EVERY, ids=EVERY_ID)
def test_a_failed_log_is_never_fits_nor_refused(case, with_flags):
    graded = grade(case, with_flags)
    if not case["failed"]:
        return
    assert graded.diagnoses, f"{case['id']}: refused: {graded.error}"
    for d in graded.diagnoses:
        assert d.kind not in ("fits", "within_watermark"), (case["id"], d.summary)
        assert "no memory failure" not in d.summary, (case["id"], d.summary)


@pytest.mark.parametrize("with_flags", [False, True], ids=["log only", "with --flags"])
@pytest.mark.parametrize("case", EVERY, ids=EVERY_ID)
def test_no_suggestion_repeats_a_setting_in_place(case, with_flags):
    """Nothing already set (in the log or the case's flags) is suggested again, nor lowered where set higher."""
    graded = grade(case, with_flags)
    from harness.diagnose.settings import merged, settings_in

    given = settings_given(flags_text(case.get("flags"))) if with_flags else {}
    settings = merged(settings_in(case["log"]), given)
    for d in graded.diagnoses:
        for change in d.changes:
            assert change.lever, (case["id"], change)
            assert not in_place(change, change.lever, settings), (case["id"], change.setting)


@pytest.mark.parametrize("case", EVERY, ids=EVERY_ID)
def test_each_engine_is_read_by_its_own_reader(case):
    """Told the engine, its reader answers; from the log alone, never another engine's reader."""
    expected = READER_OF.get(case["engine"].lower())
    informed, plain = grade(case, with_flags=True), grade(case, with_flags=False)
    assert informed.diagnoses and plain.diagnoses, case["id"]
    if expected is not None:
        assert informed.diagnoses[0].reader == expected, (case["id"], informed.diagnoses[0].reader)
    engines = {"vllm", "sglang", "tgi", "trtllm"} - {expected}
    assert plain.diagnoses[0].reader not in engines, (case["id"], plain.diagnoses[0].reader)


@pytest.mark.parametrize("case", EVERY, ids=EVERY_ID)
def test_parts_of_a_log_and_logs_pasted_together_never_crash_nor_fit(case):
    """A log cut anywhere, or followed by another case's log, is read without a crash, and a part with an
    out-of-memory line, a traceback or an error stated in any words is never "fits"."""
    lines = case["log"].splitlines()
    other = EVERY[(EVERY.index(case) + 1) % len(EVERY)]["log"]
    for part in ("\n".join(lines[: len(lines) // 2]), "\n".join(lines[len(lines) // 3:]), case["log"] + "\n" + other):
        try:
            found = diagnose_all(part, case["id"], Context(engine=READER_OF.get(case["engine"].lower())))
        except NotADiagnosableLog:
            continue
        if re.search(r"out of memory|Traceback", part, re.I) or failure_lines(part):
            assert all(d.kind != "fits" for d in found), (case["id"], [d.summary for d in found])
        for d in found:  # "fits" only on the engine's own completed start-up (what its KV cache holds)
            assert d.kind != "fits" or any(f.label == "KV cache holds" for f in d.figures), (case["id"], d.summary)


def graded_table(corpus: list[dict] = CASES) -> tuple[list[Graded], str]:
    rows = [grade(case, with_flags=True) for case in corpus if case["failed"]]
    lines = ["| case | engine | kind | first change | confirmed | ok |", "|---|---|---|---|---|---|"]
    for g in rows:
        main = g.diagnoses[0] if g.diagnoses else None
        first = f"`{g.first.setting[:60]}` ({g.first.lever})" if g.first else "(none)"
        lines.append(f"| {g.case['id']} | {g.case['engine']} | {main.kind if main else 'refused'} | "
                     f"{first.replace('|', '/')} | {', '.join(g.case['confirmed_levers'])} | "
                     f"{'yes' if g.right else 'no'} |")
    right = sum(g.right for g in rows)
    lines.append("")
    lines.append(f"First change confirmed in {right} of {len(rows)} logs ({right / max(len(rows), 1):.1%}).")
    return rows, "\n".join(lines)


def test_first_change_is_a_confirmed_lever_in_most_logs():
    if not any(case["failed"] for case in CASES):
        pytest.skip("the corpus is empty")
    rows, table = graded_table()
    misses = [g for g in rows if not g.right]
    print("\n" + table)
    share = 1 - len(misses) / len(rows)
    assert share >= FIRST_CHANGE_RIGHT, (f"first change right in {share:.0%} of {len(rows)}; misses:\n"
                                         + "\n".join(f"{g.case['id']}: {g.first.lever if g.first else None} not in "
                                                     f"{g.case['confirmed_levers']}" for g in misses))


def held_out_block(held_out: list[dict]) -> str:
    """The held-out set's grading, or, while the folder holds no case, where the blind gradings are recorded."""
    if not held_out:
        return ("No held-out logs at present: the earlier sets joined the corpus once they had been graded blind "
                "(their gradings, and why no new set is there, are in tests/fixtures/diagnose_holdout/README.md).")
    return ("The held-out logs (tests/fixtures/diagnose_holdout/, collected blind and never used to tune which change "
            "comes first; the rules for what is a failure were fixed after their one blind grading, see its README):"
            "\n\n" + graded_table(held_out)[1])


def share_of(corpus: list[dict]) -> tuple[int, int]:
    """(first changes right, failed logs), graded as the table grades them."""
    rows = [grade(case, with_flags=True) for case in corpus if case["failed"]]
    return sum(g.right for g in rows), len(rows)


def _held_out_share() -> str:
    right, failed = share_of(HELD_OUT)
    return f"{right} of {failed} = {right / max(failed, 1):.1%}"


# The held-out share is measured honestly and recorded, not hidden: while it is below the bar this is a strict xfail
# whose reason carries the figures; once it reaches the bar it XPASSes, which fails, and the mark is to go (a plain
# assertion). The invariants above (never fits, nothing repeated, no crash, own reader) stay hard for held-out logs.
@pytest.mark.xfail(condition=any(case["failed"] for case in HELD_OUT), strict=True,
                   reason=f"issue #40: on the held-out logs the first change is a confirmed lever in {_held_out_share()}"
                   f", below {FIRST_CHANGE_RIGHT:.0%} (graded blind once; docs/troubleshooting.md lists the misses)")
def test_first_change_is_a_confirmed_lever_on_held_out_logs():
    """Issue #40's done-when: the share holds on logs the readers were never shaped on as well."""
    held_out = [case for case in HELD_OUT if case["failed"]]
    if not held_out:
        pytest.skip("no held-out failure logs: the last set was graded blind and moved into the corpus "
                    "(tests/fixtures/diagnose_holdout/README.md has the gradings and why no new set is there)")
    rows, table = graded_table(held_out)
    print("\n" + table)
    share = sum(g.right for g in rows) / len(rows)
    assert share >= FIRST_CHANGE_RIGHT, f"held out: first change right in {share:.0%} of {len(rows)}"


def test_the_held_out_share_is_recorded_as_a_strict_xfail_with_its_figures():
    """While held-out logs are there, the share test is a strict xfail whose reason carries right/failed from the
    cases themselves (so reaching the bar turns it red, and the mark must become a plain assertion)."""
    mark = next(m for m in test_first_change_is_a_confirmed_lever_on_held_out_logs.pytestmark if m.name == "xfail")
    assert mark.kwargs["strict"] is True
    assert mark.kwargs["condition"] == any(case["failed"] for case in HELD_OUT)
    right, failed = share_of(HELD_OUT)
    assert f"{right} of {failed} = " in mark.kwargs["reason"]
    sample = [c for c in CASES if c["failed"]][:3]
    assert share_of(sample) == (sum(grade(c, with_flags=True).right for c in sample), 3)


def test_a_first_change_of_lever_other_is_never_right():
    """`other` meeting a confirmed `other` is not a match (the strict grading, issue #40); a named lever still is."""
    from harness.diagnose.records import Change, Diagnosis

    def graded(lever: str, confirmed: list[str]) -> Graded:
        answer = Diagnosis("x", "pytorch-oom", "out_of_memory", "ran out", changes=(Change("a fix", "less", lever),))
        return Graded({"id": "x", "confirmed_levers": confirmed}, (answer,))

    assert not graded(OTHER, [OTHER]).right
    assert not graded(OTHER, ["batch_size_down", OTHER]).right
    assert graded("batch_size_down", ["batch_size_down", OTHER]).right
    assert not graded("batch_size_down", [OTHER]).right
    right, failed = share_of([c for c in EVERY if c["failed"] and c["confirmed_levers"] == [OTHER]])
    assert right == 0 and failed > 0


def test_every_confirmed_lever_is_in_the_corpus_readme_lever_table():
    """Labels use only the ids the corpus README defines (a new id joins that table with its meaning first)."""
    readme = (CORPUS / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Lever ids", 1)[1].split("\n## ", 1)[0]
    defined = set(re.findall(r"^\| ([a-z0-9_]+) \|", table, re.M))
    assert {"attention_kernel", "image_resolution_down", "map_location", "upgrade", OTHER} <= defined
    for case in EVERY:
        assert set(case["confirmed_levers"]) <= defined, (case["id"], case["confirmed_levers"])


def test_held_out_logs_share_no_source_with_the_corpus():
    """A held-out case is one the readers were not shaped on: neither its id nor its source thread is in the corpus."""
    corpus_ids = {c["id"] for c in CASES}
    corpus_sources = {c["source"] for c in CASES}
    for case in HELD_OUT:
        assert case["id"] not in corpus_ids and case["source"] not in corpus_sources, case["id"]


def test_the_docs_say_so_while_no_held_out_log_is_there():
    assert "No held-out logs at present" in held_out_block([])
    graded = held_out_block([c for c in CASES if c["failed"]][:2])
    assert "First change confirmed in" in graded and "of 2 logs" in graded


def docs_block() -> str:
    _, table = graded_table()
    return (f"{TABLE_BEGIN}\n\nWritten by `PYTHONPATH=. python -m tests.test_diagnose_corpus --write-docs` "
            f"(each case's log with its flags given as --flags):\n\n{table}\n\n{held_out_block(HELD_OUT)}"
            f"\n\n{TABLE_END}")


def test_the_docs_table_is_the_current_grading():
    text = DOCS.read_text(encoding="utf-8")
    assert docs_block() in text, ("docs/troubleshooting.md's graded table is stale: "
                                  "PYTHONPATH=. python -m tests.test_diagnose_corpus --write-docs")


def write_docs(path: Path = DOCS) -> None:
    """Replace the table between the markers in docs/troubleshooting.md (appended with its heading if absent)."""
    block = docs_block()
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if TABLE_BEGIN in text and TABLE_END in text:
        text = re.sub(re.escape(TABLE_BEGIN) + ".*?" + re.escape(TABLE_END), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n## `diagnose` graded on real failure logs\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    if "--write-docs" in sys.argv:
        write_docs()
    else:
        print(graded_table()[1])
