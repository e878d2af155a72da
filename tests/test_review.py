"""Spot checks by people (harness.review): the exact statistics, the plan, the judgments' checks, the fold into the
verdict, the local server, and the page itself in a real headless Chromium judged with the keyboard."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from devtools import DevToolsBrowser, browser, load_page  # noqa: F401 (browser: the fixture)
from harness import cli
from harness.review.exact import clopper_pearson, fleiss_kappa, items_for_upper_bound, upper_bound
from harness.review.summary import Share, SpotCheckSummary, judge

FIXTURE = Path(__file__).parent / "fixtures" / "run_example"
HOSTILE = "</script><img src=x onerror=alert(1)>退款需要 5 个工作日"
SPOT_POLICY = """
floors = {{ f1 = 50.0, rougeL = 30.0 }}
[spot_checks]
required = {required}
min_reviewed = {min_reviewed}
max_unacceptable_increase = 5.0
"""


# --- statistics ---------------------------------------------------------------------------------------------------


def test_exact_intervals_against_known_values():
    low, high = clopper_pearson(5, 20)  # Clopper-Pearson 95%, 5 of 20: [0.0866, 0.4910]
    assert (round(low, 4), round(high, 4)) == (0.0866, 0.4910)
    assert clopper_pearson(0, 20)[1] == pytest.approx(0.1684, abs=1e-4)
    assert upper_bound(0, 20, 0.05) == pytest.approx(1 - 0.05 ** (1 / 20), abs=1e-9)  # one-sided: 0.1391
    assert upper_bound(0, 60, 0.05) == pytest.approx(0.0487, abs=1e-4)
    assert items_for_upper_bound(0.0, 0.05, 0.05, 20) == 59  # 1 - 0.05 ** (1 / 59) = 0.0495 <= 5%
    assert items_for_upper_bound(0.06, 0.05, 0.05, 20) is None


def test_fleiss_kappa_worked_example():
    """Fleiss (1971) as in the usual worked example: 10 items, 14 raters, 5 categories, kappa 0.210."""
    table = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1], [7, 7, 0, 0, 0],
             [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]
    ratings = [[c for c, count in enumerate(row) for _ in range(count)] for row in table]
    assert fleiss_kappa([[str(c) for c in r] for r in ratings]) == pytest.approx(0.210, abs=1e-3)
    assert fleiss_kappa([["ok", "ok"], ["ok", "ok"]]) is None  # one category: chance agreement is 1


def _summary(judged: int, candidate_bad: int, baseline_bad: int = 0, newly_good: int = 0) -> SpotCheckSummary:
    from harness.review.exact import lower_bound

    newly_bad = candidate_bad - baseline_bad + newly_good
    share = Share(0, judged, 0.0, 0.0, 100.0)
    return SpotCheckSummary("int8", ("alice",), judged, judged, share, share, share, newly_bad, newly_good,
                            100.0 * (candidate_bad - baseline_bad) / judged,
                            100.0 * (lower_bound(newly_bad, judged, 0.025) - upper_bound(newly_good, judged, 0.025)),
                            100.0 * upper_bound(newly_bad, judged, 0.05), None, 0, 0, 0)


def test_the_rule_needs_enough_judged_items_for_a_5_point_limit():
    rule = dict(required=True, min_reviewed=20, max_increase=5.0, confidence=0.95)
    twenty = judge(_summary(20, 0), **rule)
    assert twenty.status == "inconclusive" and "about 39 more judged items" in twenty.detail
    assert judge(_summary(60, 0), **rule).status == "pass"
    failing = judge(_summary(30, 12), **rule)
    assert failing.status == "fail" and failing.counts and "even the lower bound" in failing.detail
    assert judge(_summary(10, 0), **rule).detail.endswith("judge 10 more")
    assert judge(None, **rule).status == "inconclusive"
    assert judge(None, **dict(rule, required=False)) is None
    advisory = judge(_summary(20, 0), **dict(rule, required=False))
    assert advisory.status == "inconclusive" and not advisory.counts  # shown, does not hold a GO back


# --- the plan, the judgments, the fold ----------------------------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    for row in rows:  # untrusted text in an output: it must be shown, never run
        if row["format"] == "int8" and row["id"] == "q001":
            row["prediction"] = HOSTILE
    (run / "samples.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return run


def _plan(run: Path) -> dict:
    """The plan with its A/B key (review-plan.json holds no key: read through read_plan)."""
    from dataclasses import asdict

    from harness.review.plan import read_plan

    plan = read_plan(run)
    return {"plan": plan.plan, "run": plan.run, "items": [asdict(item) for item in plan.items]}


def _write_judgments(run: Path, name: str, verdict_for_candidate: str, items: list[dict] | None = None) -> Path:
    """A reviewer who finds the candidate 'bad' (unacceptable, baseline better) or 'fine' (both acceptable, same)."""
    path = run / f"review-{name}.jsonl"
    path.write_text("".join(line + "\n" for line in _judgment_lines(run, name, verdict_for_candidate, items)))
    return path


def _judgment_lines(run: Path, name: str, verdict_for_candidate: str, items: list[dict] | None = None) -> list[str]:
    plan = _plan(run)
    lines = []
    for item in items or plan["items"]:
        a_base = item["a"] == "baseline"
        bad = verdict_for_candidate == "bad"
        lines.append(json.dumps({
            "schema": "quantgate.review/1", "run": plan["run"], "plan": plan["plan"], "item": item["key"],
            "reviewer": name, "preference": ("A" if a_base else "B") if bad else "same",
            "acceptable_a": a_base or not bad, "acceptable_b": not a_base or not bad, "comment": "",
            "hash_a": item["baseline_hash"] if a_base else item["candidate_hash"],
            "hash_b": item["candidate_hash"] if a_base else item["baseline_hash"]}))
    return lines


def test_plan_is_seeded_spread_over_the_evalsets_and_keeps_the_worst_apart(run_dir: Path, capsys):
    assert cli.main(["review", str(run_dir), "--items", "6", "--worst", "1"]) == 0
    plan = _plan(run_dir)
    random_items = [i for i in plan["items"] if i["stratum"] == "random"]
    assert {i["format"] for i in random_items} == {"int8", "gptq"}  # awq failed: nothing to judge
    for name in ("int8", "gptq"):
        per_set = [i["evalset"] for i in random_items if i["format"] == name]
        assert sorted(per_set.count(e) for e in set(per_set)) == [2, 2, 2]
    assert {i["a"] for i in plan["items"]} <= {"baseline", "candidate"}
    assert all(i["why"] for i in plan["items"] if i["stratum"] == "worst")
    first = (run_dir / "review-plan.json").read_text()
    assert cli.main(["review", str(run_dir), "--items", "6", "--worst", "1"]) == 0  # the same plan again
    assert (run_dir / "review-plan.json").read_text() == first
    html = (run_dir / "review.html").read_text()
    assert "<img src=x" not in html and "\\u003c/script\\u003e" in html  # the output travels escaped
    _write_judgments(run_dir, "alice", "fine")
    assert cli.main(["review", str(run_dir), "--items", "4"]) == 2  # a new plan would orphan alice's judgments
    assert "pass --new-plan" in capsys.readouterr().err


def test_judgments_fold_into_the_verdict_and_accumulate(run_dir: Path, tmp_path: Path, capsys):
    assert cli.main(["review", str(run_dir), "--items", "8"]) == 0
    before = json.loads((run_dir / "report.json").read_text())
    assert before["formats"]["int8"]["verdict"] == "GO"
    # bob: nothing unacceptable on 8 items, not required: int8 stays GO, the spot check shown, not counted
    fine = _write_judgments(run_dir, "bob", "fine")
    assert cli.main(["report", str(run_dir), "--reviews", str(fine)]) == 1  # gptq stays INCONCLUSIVE
    only_bob = json.loads((run_dir / "report.json").read_text())["formats"]["int8"]
    assert only_bob["verdict"] == "GO" and only_bob["spot_checks"]["status"] is None
    # required by the policy: 8 judged of 20 needed holds the GO back
    policy = tmp_path / "policy.toml"
    policy.write_text(SPOT_POLICY.format(required="true", min_reviewed=20))
    assert cli.main(["report", str(run_dir), "--reviews", str(fine), "--policy", str(policy)]) == 1
    held = json.loads((run_dir / "report.json").read_text())["formats"]["int8"]
    assert held["verdict"] == "INCONCLUSIVE" and "the plan holds 8 for this format: make a larger plan" in held["reasons"][0]
    other = tmp_path / "other.toml"
    other.write_text(SPOT_POLICY.format(required="true", min_reviewed=20).replace("50.0", "60.0"))
    assert cli.main(["report", str(run_dir), "--reviews", str(fine), "--policy", str(other)]) == 2
    assert "differs from the run's policy in floors" in capsys.readouterr().err
    # alice finds every candidate output unacceptable: folded alone, bob's kept judgments count with hers (a tie
    # counts against the candidate) and the fold starts from the verdict before the spot checks
    bad = _write_judgments(run_dir, "alice", "bad")
    assert cli.main(["report", str(run_dir), "--reviews", str(bad)]) == 1
    after = json.loads((run_dir / "report.json").read_text())
    int8 = after["formats"]["int8"]
    assert int8["verdict"] == "NO-GO" and int8["spot_checks"]["status"] == "fail"
    assert int8["spot_checks"]["reviewers"] == ["alice", "bob"] and int8["spot_checks"]["multiply_judged"] == 8
    assert int8["spot_checks"]["candidate_unacceptable"]["count"] == 8 and int8["spot_checks"]["verdict_without"] == "GO"
    assert [c["kind"] for c in int8["checks"]].count("spot_check") == 1
    assert any(c["kind"] == "spot_check" and c["status"] == "fail" for c in int8["checks"])
    assert after["recommendation"]["format"] is None and after["exit_code"] == 1
    md = (run_dir / "report.md").read_text()
    assert "**Spot checks by people**" in md and "Judged unacceptable" in md
    assert "img src=x" in md  # quoted as text
    html = (run_dir / "report.html").read_text()
    assert "Spot checks by people" in html and "<img src=x" not in html
    # bob's file folded again: alice's judgments are kept, the verdict stays NO-GO
    assert cli.main(["report", str(run_dir), "--reviews", str(fine)]) == 1
    again = json.loads((run_dir / "report.json").read_text())["formats"]["int8"]
    assert again["verdict"] == "NO-GO" and again["spot_checks"]["reviewers"] == ["alice", "bob"]


@pytest.mark.parametrize("edit, field, message", [
    (lambda line, plan: dict(line, hash_b="0" * 16), "hash_b", "edited by hand"),
    (lambda line, plan: dict(line, run="f" * 16), "run", "judged on another run"),
    (lambda line, plan: dict(line, plan="e" * 16), "plan", "another review plan"),
    (lambda line, plan: dict(line, item="int8/en_support_qa/q999"), "item", "not in this run's review plan"),
    (lambda line, plan: dict(line, preference="better"), "preference", "expected one of A, same, B"),
    (lambda line, plan: dict(line, acceptable_a="yes"), "acceptable_a", "expected true or false"),
])
def test_a_judgment_file_edited_by_hand_is_refused_with_file_and_line(run_dir: Path, capsys, edit, field, message):
    assert cli.main(["review", str(run_dir), "--items", "4"]) == 0
    path = _write_judgments(run_dir, "mallory", "fine")
    lines = path.read_text().splitlines()
    lines[2] = json.dumps(edit(json.loads(lines[2]), _plan(run_dir)))
    path.write_text("\n".join(lines) + "\n")
    before = (run_dir / "report.json").read_text()
    assert cli.main(["report", str(run_dir), "--reviews", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3: field '{field}'" in err and message in err and err.count("\n") == 1, err
    assert (run_dir / "report.json").read_text() == before  # nothing rewritten


def test_an_output_that_changed_since_it_was_judged_is_refused(run_dir: Path, capsys):
    assert cli.main(["review", str(run_dir), "--items", "4"]) == 0
    path = _write_judgments(run_dir, "alice", "fine")
    judged = json.loads(path.read_text().splitlines()[0])["item"].split("/")
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    for row in rows:
        if [row["format"], row["evalset"], row["id"]] == judged:
            row["prediction"] += " (rerun)"
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    assert cli.main(["report", str(run_dir), "--reviews", str(path)]) == 2
    assert "changed since it was judged" in capsys.readouterr().err


def test_serve_writes_checked_judgments_into_the_run(run_dir: Path):
    from harness.review.server import make_server, serve_in_thread
    from harness.review.session import open_review

    review = open_review(run_dir, items=4, worst=0, seed=0, formats=None, new_plan=False)
    server = make_server(review.page(serve=True), review.save)
    serve_in_thread(server)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        page = urllib.request.urlopen(base + "/").read().decode()
        assert '"serve": true' in page
        good = "".join(line + "\n" for line in _judgment_lines(run_dir, "carol", "fine")).encode()
        reply = urllib.request.urlopen(urllib.request.Request(base + "/judgments?reviewer=carol", data=good))
        assert reply.status == 200 and (run_dir / "review-carol.jsonl").read_bytes() == good
        dave = good.replace(b'"carol"', b'"dave"')
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(base + "/judgments?reviewer=dave",
                                                          data=dave.replace(b'"same"', b'"maybe"')))
        assert refused.value.code == 422 and b"dave's save, line 1: field 'preference'" in refused.value.read()
        assert not (run_dir / "review-dave.jsonl").exists() and not list(run_dir.glob(".review-*"))
    finally:
        server.shutdown()
        server.server_close()


# --- the page in a real browser -----------------------------------------------------------------------------------


def _key(b: DevToolsBrowser, key: str) -> None:
    special = {"Enter": ("Enter", 13, "\r"), "ArrowRight": ("ArrowRight", 39, "")}
    if key in special:
        code, vk, text = special[key]
    else:
        code, vk, text = (f"Key{key.upper()}" if key.isalpha() else f"Digit{key}"), ord(key.upper()), key
    b.call("Input.dispatchKeyEvent", {"type": "keyDown", "key": key, "code": code, "windowsVirtualKeyCode": vk,
                                      **({"text": text} if text else {})})
    b.call("Input.dispatchKeyEvent", {"type": "keyUp", "key": key, "code": code, "windowsVirtualKeyCode": vk})


def test_review_page_judged_with_the_keyboard_in_chromium(browser: DevToolsBrowser, run_dir: Path,
                                                          tmp_path: Path):
    assert cli.main(["review", str(run_dir), "--items", "8"]) == 0
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    browser.call("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}, browser=True)
    load_page(browser, run_dir / "review.html")
    assert browser.evaluate("document.activeElement.id") == "name"  # the name is asked once, first
    browser.call("Input.insertText", {"text": "alice"})
    _key(browser, "Enter")
    plan = _plan(run_dir)
    for index, item in enumerate(plan["items"]):
        shown = browser.evaluate("document.getElementById('where').textContent")
        assert item["key"].split("/")[-1] in shown, (index, shown)
        if item["a"] == "baseline":  # the candidate is B: B unacceptable, A better
            keys = ["q", "p", "1"]
        else:
            keys = ["w", "o", "3"]
        for key in keys:
            _key(browser, key)
        _key(browser, "j")
    hostile = browser.evaluate("""(() => { for (let i = 0; i < 20; i++) {
        const a = document.getElementById('out-a').textContent, b = document.getElementById('out-b').textContent;
        if (a.includes('onerror') || b.includes('onerror')) return true;
        document.dispatchEvent(new KeyboardEvent('keydown', {key: 'k'})); } return false; })()""")
    assert hostile, "the hostile output is shown as text on its item"
    assert browser.evaluate("document.querySelectorAll('img').length") == 0 and not browser.dialogs()
    assert f"{len(plan['items'])} of {len(plan['items'])} judged" in browser.evaluate(
        "document.getElementById('count').textContent")
    _key(browser, "s")
    saved = downloads / "review-alice.jsonl"
    deadline = time.monotonic() + 30
    while not saved.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert saved.is_file(), list(downloads.iterdir())
    lines = [json.loads(line) for line in saved.read_text().splitlines()]
    assert len(lines) == len(plan["items"]) and {line["reviewer"] for line in lines} == {"alice"}
    assert not browser.console_problems()
    # progress survives a reload (localStorage, per plan)
    load_page(browser, run_dir / "review.html")
    assert browser.evaluate("document.getElementById('count').textContent").startswith(
        f"{len(plan['items'])} of {len(plan['items'])} judged")
    # fed back: every candidate judged unacceptable on 8 items each is NO-GO under the default policy
    assert cli.main(["report", str(run_dir), "--reviews", str(saved)]) == 1
    report = json.loads((run_dir / "report.json").read_text())
    assert report["formats"]["int8"]["verdict"] == "NO-GO"
    assert report["formats"]["int8"]["spot_checks"]["candidate_unacceptable"]["count"] == 8
