"""Spot checks that keep every judgment and their blinding (#38): folds accumulate, a plan is never replaced under
judgments quantgate knows of, `review --serve` appends and refuses what is not its own page's, one item per format,
the A/B key out of the files a reviewer opens, comments cut, files keep their permissions."""

from __future__ import annotations

import errno
import json
import os
import shlex
import socket
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness import cli
from test_review import FIXTURE, _judgment_lines, _plan, _write_judgments


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    return run


def _report(run: Path) -> dict:
    return json.loads((run / "report.json").read_text())


def _lines(run: Path, name: str, verdict: str, items: list[dict] | None = None, **fields) -> str:
    return "".join(json.dumps({**json.loads(line), **fields}) + "\n"
                   for line in _judgment_lines(run, name, verdict, items))


def _fold(run: Path, *files: Path, notes: list[str] | None = None) -> dict:
    """`report --reviews` without the renderings (tested in test_review): report.json as the fold writes it."""
    from harness.review.session import fold_and_write

    fold_and_write(run, list(files), say=(notes.append if notes is not None else lambda note: None))
    return _report(run)


def _int8_items(run: Path) -> list[dict]:
    return [i for i in _plan(run)["items"] if i["format"] == "int8"]


# --- every judgment kept ------------------------------------------------------------------------------------------


def test_a_second_fold_never_erases_an_earlier_reviewers_failing_judgments(run_dir: Path, tmp_path: Path):
    """The issue's case: alice (all unacceptable) folded, then bob alone: NO-GO stays, it does not become
    INCONCLUSIVE or GO, and both are kept in reviews/."""
    assert cli.main(["review", str(run_dir), "--items", "8"]) == 0
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    alice = downloads / "review-alice.jsonl"
    alice.write_text(_lines(run_dir, "alice", "bad"))
    _fold(run_dir, alice)
    assert _report(run_dir)["formats"]["int8"]["verdict"] == "NO-GO"
    bob = downloads / "review-bob.jsonl"
    bob.write_text(_lines(run_dir, "bob", "fine"))
    assert cli.main(["report", str(run_dir), "--reviews", str(bob)]) == 1
    int8 = _report(run_dir)["formats"]["int8"]
    assert int8["verdict"] == "NO-GO" and int8["spot_checks"]["status"] == "fail"
    assert int8["spot_checks"]["reviewers"] == ["alice", "bob"]
    assert sorted(p.name for p in (run_dir / "reviews").iterdir()) == ["alice.jsonl", "bob.jsonl"]
    alice.unlink()  # the Downloads copy gone: the kept one still counts
    _fold(run_dir, bob)
    assert _report(run_dir)["formats"]["int8"]["spot_checks"]["reviewers"] == ["alice", "bob"]


def test_a_reviewers_file_replaces_the_kept_judgments_only_as_a_superset(run_dir: Path, tmp_path: Path):
    assert cli.main(["review", str(run_dir), "--items", "8"]) == 0
    items = _int8_items(run_dir)
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text(_lines(run_dir, "alice", "bad", items[:4]))
    _fold(run_dir, first)
    # a file with the other four items only: the first four are kept, with a note
    second.write_text(_lines(run_dir, "alice", "fine", items[4:]))
    notes: list[str] = []
    checks = _fold(run_dir, second, notes=notes)["formats"]["int8"]["spot_checks"]
    assert len(notes) == 1 and notes[0].startswith(f"alice: {second} lacks 4 item(s) judged before"), notes
    assert checks["judged"] == 8 and checks["candidate_unacceptable"]["count"] == 4
    # a superset (all eight, now all fine) replaces them, with a note; the latest line per item wins
    everything = tmp_path / "everything.jsonl"
    everything.write_text(_lines(run_dir, "alice", "fine", items))
    notes.clear()
    checks = _fold(run_dir, everything, notes=notes)["formats"]["int8"]["spot_checks"]
    assert notes == [f"alice: {everything} replaces the 8 earlier judgment(s) (it holds every item judged before, 8 "
                     "in all)"], notes
    assert checks["judged"] == 8 and checks["candidate_unacceptable"]["count"] == 0
    assert len((run_dir / "reviews" / "alice.jsonl").read_text().splitlines()) == 8
    # the same file folded again changes nothing and says nothing
    notes.clear()
    _fold(run_dir, everything, notes=notes)
    assert notes == []
    # an older judgment (judged_at before the kept one's) does not win over it
    dated = tmp_path / "dated.jsonl"
    dated.write_text(_lines(run_dir, "alice", "fine", items[:1], judged_at="2026-02-01T00:00:00Z"))
    _fold(run_dir, dated)
    stale = tmp_path / "stale.jsonl"
    stale.write_text(_lines(run_dir, "alice", "bad", items[:1], judged_at="2026-01-01T00:00:00Z"))
    assert _fold(run_dir, stale)["formats"]["int8"]["spot_checks"]["candidate_unacceptable"]["count"] == 0


def test_a_plan_is_never_replaced_while_judgments_for_it_are_known(run_dir: Path, tmp_path: Path, capsys):
    """The documented Downloads flow: the judgments sit outside the run directory. Once folded, `review` with other
    options refuses to replace their plan and names it; judgments quantgate was never told of do not hold a new
    plan back, but the plan they name is kept, and their refusal names both plans right."""
    assert cli.main(["review", str(run_dir), "--items", "8"]) == 0
    first = _plan(run_dir)["plan"]
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    alice = downloads / "review-alice.jsonl"
    alice.write_text(_lines(run_dir, "alice", "fine"))
    _fold(run_dir, alice)
    plan_text = (run_dir / "review-plan.json").read_text()
    capsys.readouterr()
    assert cli.main(["review", str(run_dir), "--items", "4"]) == 2
    err = capsys.readouterr().err
    assert f"judgments already refer to review plan {first} (reviews/alice.jsonl, report.json" in err, err
    assert "pass --new-plan" in err and err.count("\n") == 1
    assert (run_dir / "review-plan.json").read_text() == plan_text
    # not folded anywhere quantgate can see (a fresh copy of the run): the new plan replaces it, the old is kept
    other = tmp_path / "other"
    import shutil

    shutil.copytree(FIXTURE, other)
    assert cli.main(["review", str(other), "--items", "8"]) == 0
    old = _plan(other)["plan"]
    bob = downloads / "review-bob.jsonl"
    bob.write_text(_lines(other, "bob", "fine"))
    capsys.readouterr()
    assert cli.main(["review", str(other), "--items", "4"]) == 0
    assert f"replaced review plan {old}: kept as review-plan-{old}.json" in capsys.readouterr().out
    new = _plan(other)["plan"]
    assert (other / f"review-plan-{old}.json").is_file() and (other / f"review-key-{old}.json").is_file()
    assert cli.main(["report", str(other), "--reviews", str(bob)]) == 2
    err = capsys.readouterr().err
    assert f"{bob}: judged on review plan {old}, which a later `quantgate review` replaced with {new}" in err, err
    # the options that made it bring it back, key and all: bob's judgments fold
    assert cli.main(["review", str(other), "--items", "8"]) == 0
    assert f"replaced review plan {new}" in capsys.readouterr().out and _plan(other)["plan"] == old
    assert _fold(other, bob)["formats"]["int8"]["spot_checks"]["reviewers"] == ["bob"]
    # --new-plan replaces a plan with judgments: the folded ones move aside with it, nothing is deleted
    assert cli.main(["review", str(run_dir), "--items", "4", "--new-plan"]) == 0
    assert (run_dir / f"review-plan-{first}.json").is_file()
    assert (run_dir / f"reviews-{first}" / "alice.jsonl").is_file() and not (run_dir / "reviews").exists()


def test_judgments_beside_their_plan_outside_the_run_are_folded_and_the_plan_kept(run_dir: Path, tmp_path: Path):
    assert cli.main(["review", str(run_dir), "--items", "4"]) == 0
    elsewhere = tmp_path / "handed-over"
    elsewhere.mkdir()
    for name in ("review-plan.json", "review-key.json"):
        (run_dir / name).replace(elsewhere / name)
    (elsewhere / "review-alice.jsonl").write_text(_lines(elsewhere, "alice", "fine"))
    _fold(run_dir, elsewhere / "review-alice.jsonl")
    assert _plan(run_dir)["plan"] == _plan(elsewhere)["plan"]  # copied in: the next `review` knows it


# --- review --serve -----------------------------------------------------------------------------------------------


@pytest.fixture
def served(run_dir: Path):
    from harness.review.server import make_server, serve_in_thread
    from harness.review.session import open_review

    review = open_review(run_dir, items=4, worst=0, seed=0, formats=None, new_plan=False)
    server = make_server(review.page(serve=True), review.save)
    serve_in_thread(server)
    try:
        yield run_dir, server
    finally:
        server.shutdown()
        server.server_close()


def _post(server, reviewer: str, body: str, headers: dict | None = None) -> tuple[int, str]:
    url = f"http://127.0.0.1:{server.server_address[1]}/judgments?reviewer={reviewer}"
    request = urllib.request.Request(url, data=body.encode(), headers=headers or {})
    try:
        reply = urllib.request.urlopen(request)
        return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_serve_appends_each_save_and_never_overwrites_an_earlier_one(served):
    from harness.review.judgments import read_judgments
    from harness.review.plan import read_plan

    run_dir, server = served
    assert server.server_address[0] == "127.0.0.1"
    everything = _lines(run_dir, "alice", "fine")
    assert _post(server, "alice", everything)[0] == 200
    saved = run_dir / "review-alice.jsonl"
    count = len(everything.splitlines())
    assert len(saved.read_text().splitlines()) == count
    # the page saved again with one judgment changed: one line added, the rest kept
    changed = _lines(run_dir, "alice", "bad", _plan(run_dir)["items"][:1])
    status, text = _post(server, "alice", changed)
    assert status == 200 and "1 new or changed judgment(s) added" in text, text
    assert len(saved.read_text().splitlines()) == count + 1
    # the same save again adds nothing
    assert "0 new or changed" in _post(server, "alice", changed)[1]
    plan = read_plan(run_dir)
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    judgments = read_judgments([saved], plan, rows)
    assert len(judgments) == count and sum(not j.candidate_acceptable for j in judgments) == 1


def test_serve_refuses_a_line_of_another_reviewer_in_a_session(served):
    run_dir, server = served
    body = _lines(run_dir, "alice", "fine") + _lines(run_dir, "mallory", "bad").splitlines(keepends=True)[0]
    status, text = _post(server, "alice", body)
    assert status == 422 and "field 'reviewer': 'mallory' in alice's session" in text, text
    assert not (run_dir / "review-alice.jsonl").exists() and not (run_dir / "review-mallory.jsonl").exists()


@pytest.mark.parametrize("headers", [
    {"Origin": "http://evil.example", "Content-Type": "text/plain"},
    {"Origin": "null", "Content-Type": "text/plain"},
    {"Host": "evil.example:80"},
    {"Sec-Fetch-Site": "cross-site"},
])
def test_serve_refuses_a_request_the_page_did_not_send(served, headers):
    run_dir, server = served
    status, text = _post(server, "alice", _lines(run_dir, "alice", "fine"), headers)
    assert status == 403 and text.count("\n") == 0, text
    assert not (run_dir / "review-alice.jsonl").exists()
    same_origin = {"Origin": f"http://127.0.0.1:{server.server_address[1]}", "Sec-Fetch-Site": "same-origin"}
    assert _post(server, "alice", _lines(run_dir, "alice", "fine"), same_origin)[0] == 200


@pytest.mark.parametrize("length", ["abc", "-5", "1e3"])
def test_serve_answers_a_malformed_content_length_with_one_line(served, capfd, length):
    run_dir, server = served
    port = server.server_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(f"POST /judgments?reviewer=alice HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                     f"Content-Length: {length}\r\n\r\n{{}}".encode())
        reply = b""
        while chunk := conn.recv(4096):
            reply += chunk
        reply = reply.decode()
    assert reply.startswith("HTTP/1.0 400") and "Content-Length" in reply.split("\r\n\r\n", 1)[1]
    assert "Traceback" not in capfd.readouterr().err
    assert _post(server, "alice", _lines(run_dir, "alice", "fine"))[0] == 200  # still serving


def test_serve_on_a_busy_or_impossible_port_is_one_line_and_exit_2(run_dir: Path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["review", str(run_dir), "--items", "4", "--serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--port {port}: already in use on 127.0.0.1" in err and err.count("\n") == 1, err
    assert cli.main(["review", str(run_dir), "--items", "4", "--serve", "--port", "99999"]) == 2
    err = capsys.readouterr().err
    assert "--port 99999: not a port" in err and err.count("\n") == 1, err


# --- comments -----------------------------------------------------------------------------------------------------


def test_a_huge_comment_is_cut_before_it_is_kept_or_reported(run_dir: Path, tmp_path: Path):
    from harness.review.judgments import MAX_COMMENT

    assert cli.main(["review", str(run_dir), "--items", "4"]) == 0
    huge = "too long " * 20_000  # 180,000 characters
    path = tmp_path / "review-alice.jsonl"
    path.write_text(_lines(run_dir, "alice", "bad", _int8_items(run_dir)[:1], comment=huge))
    assert cli.main(["report", str(run_dir), "--reviews", str(path)]) == 1
    comment = _report(run_dir)["formats"]["int8"]["spot_checks"]["unacceptable_items"][0]["comments"][0]
    assert len(comment) < MAX_COMMENT + 100 and comment.endswith(f"{len(huge):,} characters, the first 4,000 kept]")
    assert huge not in (run_dir / "report.html").read_text() and len((run_dir / "report.json").read_text()) < 100_000
    kept = json.loads((run_dir / "reviews" / "alice.jsonl").read_text())
    assert kept["comment"] == comment


# --- blinding -----------------------------------------------------------------------------------------------------


def test_an_item_is_shown_for_one_format_only(run_dir: Path, capsys):
    """The default plan on 18 items and two formats: every item once; each format gets its half, and says so."""
    assert cli.main(["review", str(run_dir), "--worst", "2"]) == 0
    out = capsys.readouterr().out
    items = _plan(run_dir)["items"]
    pairs = [(i["evalset"], i["id"]) for i in items]
    assert len(pairs) == len(set(pairs)) == 18
    counted = {name: sum(1 for i in items if i["format"] == name and i["stratum"] == "random")
               for name in ("int8", "gptq")}
    assert counted == {"int8": 9, "gptq": 9}
    assert "int8: 9 of 20 items" in out and "shown for one format only" in out


def test_the_ab_key_is_in_no_file_the_reviewer_opens(run_dir: Path, tmp_path: Path, capsys):
    assert cli.main(["review", str(run_dir), "--items", "8"]) == 0
    plan_file = json.loads((run_dir / "review-plan.json").read_text())
    page = (run_dir / "review.html").read_text()
    data = json.loads(page.split('<script id="review-data" type="application/json">', 1)[1].split("</script>", 1)[0])
    shown = {item["key"]: [item["hash_a"], item["hash_b"]] for item in data["items"]}
    for item in plan_file["items"]:
        assert set(item) == {"key", "format", "evalset", "id", "stratum", "why", "shown"}  # no side named
        assert item["shown"] == shown[item["key"]]
    assert all(set(item) == {"key", "format", "evalset", "id", "stratum", "input", "reference", "a", "b", "hash_a",
                             "hash_b"} for item in data["items"])  # A and B: the outputs, no side named
    for text in (json.dumps(plan_file), page):
        assert '"baseline_hash"' not in text and '"candidate_hash"' not in text
    key = json.loads((run_dir / "review-key.json").read_text())
    assert set(key["a"].values()) <= {"baseline", "candidate"} and len(key["salt"]) == 32
    # the fold reads the key: judgments fold, a key that is not the plan's or none at all is refused
    alice = _write_judgments(run_dir, "alice", "bad")
    (run_dir / "review-key.json").write_text(json.dumps({**key, "a": {k: "baseline" for k in key["a"]}}))
    assert cli.main(["report", str(run_dir), "--reviews", str(alice)]) == 2
    assert "review-key.json: not the key of" in capsys.readouterr().err
    (run_dir / "review-key.json").unlink()
    assert cli.main(["report", str(run_dir), "--reviews", str(alice)]) == 2
    assert "review-key.json: missing; it holds the A/B order of plan" in capsys.readouterr().err
    (run_dir / "review-key.json").write_text(json.dumps(key))
    _fold(run_dir, alice)
    assert _report(run_dir)["formats"]["int8"]["spot_checks"]["candidate_unacceptable"]["count"] == 8


def test_a_version_1_plan_keeps_its_id_and_its_judgments(run_dir: Path):
    """A plan written before the key moved out (the A/B order inline): read, rewritten with its key apart under
    the same id, and the judgments made on it fold."""
    from dataclasses import asdict

    from harness.review.plan import read_plan

    assert cli.main(["review", str(run_dir), "--items", "4"]) == 0
    plan = read_plan(run_dir)
    legacy = {"schema": "quantgate.review-plan/1", "plan": plan.plan, "run": plan.run, "baseline": plan.baseline,
              "seed": 0, "items_per_format": 4, "worst_per_format": 0, "items": [asdict(i) for i in plan.items]}
    (run_dir / "review-plan.json").write_text(json.dumps(legacy))
    (run_dir / "review-key.json").unlink()
    alice = _write_judgments(run_dir, "alice", "bad")
    assert cli.main(["review", str(run_dir), "--items", "4"]) == 0
    assert json.loads((run_dir / "review-plan.json").read_text())["schema"] == "quantgate.review-plan/2"
    assert read_plan(run_dir).plan == plan.plan
    _fold(run_dir, alice)
    int8 = _report(run_dir)["formats"]["int8"]
    assert int8["spot_checks"]["plan"] == plan.plan and int8["spot_checks"]["candidate_unacceptable"]["count"] == 4


# --- files --------------------------------------------------------------------------------------------------------


def test_files_keep_their_permissions_and_new_ones_get_the_umask(run_dir: Path):
    assert cli.main(["review", str(run_dir), "--items", "4"]) == 0
    umask = os.umask(0o022)
    os.umask(umask)
    for name in ("review.html", "review-plan.json", "review-key.json"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o666 & ~umask, name
    for name in ("report.json", "review.html", "review-plan.json"):
        os.chmod(run_dir / name, 0o640)
    alice = _write_judgments(run_dir, "alice", "fine")
    assert cli.main(["review", str(run_dir), "--items", "4"]) == 0
    _fold(run_dir, alice)
    for name in ("report.json", "review.html", "review-plan.json"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o640, name


def test_a_write_error_names_the_file_not_the_temp_file(tmp_path: Path, monkeypatch):
    from harness.cache import atomic_write_text

    target = tmp_path / "report.json"
    target.write_text("previous\n")

    def refused(src, dst):
        raise PermissionError(errno.EACCES, "Permission denied", src)

    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(PermissionError) as caught:
        atomic_write_text(target, "new\n")
    assert caught.value.filename == str(target) and str(target) in str(caught.value)
    assert target.read_text() == "previous\n" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_the_help_review_example_can_be_pasted():
    lines = [line.strip() for line in cli.EXAMPLES.splitlines() if line.strip().startswith("quantgate re")]
    parser = cli.build_parser()
    review = [shlex.split(line) for line in lines if line.split()[1] == "review"]
    folds = [shlex.split(line) for line in lines if "--reviews" in line]
    assert review and folds
    for argv in review + folds:
        args = parser.parse_args(argv[1:])  # every word an argument: no "then:" prose in the line
        assert args.command == argv[1]
    assert all(str(p).startswith("runs/today/") for p in parser.parse_args(folds[0][1:]).reviews)
