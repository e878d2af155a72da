"""The review of one run directory: its report, its samples, its plan; the page, the server, the fold."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from harness.errors import UserError
from harness.review.plan import (PLAN_FILE, ReviewPlan, archive_plan, archived_plan_path, archived_plans, build_plan,
                                 read_plan, write_plan)
from harness.review.store import KEPT_DIR, Merged, kept_files

PAGE_FILE = "review.html"


@dataclass(frozen=True)
class RunData:
    run_dir: Path
    report: Any  # RunReport
    rows: list[dict[str, Any]]


def load_run(run_dir: Path) -> RunData:
    from harness.report import load_report
    from harness.report.view import load_samples, samples_path

    run_dir = Path(run_dir)
    if run_dir.name == "report.json" and run_dir.is_file():
        run_dir = run_dir.parent
    report = load_report(run_dir / "report.json" if run_dir.is_dir() else run_dir)
    samples = samples_path(run_dir, report)
    if not samples.is_file():
        raise UserError(f"{samples}: missing; the outputs people judge come from it: restore it or rerun the run")
    return RunData(run_dir, report, load_samples(samples))


@dataclass(frozen=True)
class Review:
    run: RunData
    plan: ReviewPlan
    replaced: str | None = None  # the plan this one replaced (kept as review-plan-ID.json)

    @property
    def plan_path(self) -> Path:
        return self.run.run_dir / PLAN_FILE

    def page(self, serve: bool = False) -> str:
        from harness.review.page import page_items, render_page

        languages = {name: info.language for name, info in self.run.report.evalsets.items()}
        items = page_items(self.plan, self.run.rows, _item_inputs(self.run.report))
        title = f"{Path(self.run.report.model.path).name} ({self.run.report.model.source})"
        return render_page(self.plan, items, languages, title, serve)

    def write_page(self) -> Path:
        from harness.cache import atomic_write_text

        path = self.run.run_dir / PAGE_FILE
        atomic_write_text(path, self.page())
        return path

    def serve(self, port: int) -> int:
        from harness.review.server import make_server, serve_in_thread

        server = make_server(self.page(serve=True), self.save, port)
        host, bound = server.server_address[:2]
        print(f"serving the review page at http://{host}:{bound}/ ; judgments are added to {self.run.run_dir} "
              "when saved; Ctrl-C stops", flush=True)
        stop = {"now": False}

        def _stop(*_):
            stop["now"] = True

        previous = signal.signal(signal.SIGTERM, _stop)
        thread = serve_in_thread(server)
        try:
            while not stop["now"] and thread.is_alive():
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        finally:
            server.shutdown()
            server.server_close()
            signal.signal(signal.SIGTERM, previous)
        saved = sorted(p.name for p in self.run.run_dir.glob("review-*.jsonl"))
        print(f"stopped; judgments in {self.run.run_dir}: {', '.join(saved) or 'none yet'}")
        return 0

    def save(self, reviewer: str, body: str) -> str:
        """One save from the served page, in `reviewer`'s session: every line checked as `report --reviews`
        checks it and naming that reviewer, then appended to review-REVIEWER.jsonl; UserError, nothing written,
        for a bad line."""
        from harness.review.judgments import read_judgment_lines
        from harness.review.store import append_save

        run_dir = self.run.run_dir
        target = run_dir / f"review-{reviewer}.jsonl"
        staged = run_dir / f".review-{reviewer}.{os.getpid()}.{secrets.token_hex(4)}.part"
        try:
            staged.write_text(body, encoding="utf-8")
            lines = read_judgment_lines([staged], self.plan, self.run.rows)
        except UserError as exc:
            named = re.sub(re.escape(str(staged)) + r":(\d+)", rf"{reviewer}'s save, line \1", str(exc))
            raise UserError(named.replace(str(staged), f"{reviewer}'s save")) from None
        finally:
            staged.unlink(missing_ok=True)
        for judgment, _ in lines:
            if judgment.reviewer != reviewer:
                line = judgment.where.rsplit(":", 1)[-1]
                raise UserError(f"{reviewer}'s save, line {line}: field 'reviewer': {judgment.reviewer!r} in "
                                f"{reviewer}'s session: a save holds its own reviewer's judgments only; nothing "
                                "was saved")
        appended, items = append_save(target, lines)
        return f"{target}: {appended} new or changed judgment(s) added, {items} item(s) judged in all"


def open_review(run_dir: Path, *, items: int, worst: int, seed: int, formats: list[str] | None,
                new_plan: bool) -> Review:
    """The run's review under these options. The plan already written is kept when it holds the same sample;
    a different one replaces it only when no judgment quantgate knows of (the run directory's review-*.jsonl,
    the judgments folded into it, its report.json) refers to it, or with new_plan; the plan replaced, and the
    judgments folded on it, are kept aside (review-plan-ID.json, reviews-ID/)."""
    run = load_run(run_dir)
    try:
        previous = read_plan(run.run_dir) if (run.run_dir / PLAN_FILE).is_file() else None
    except UserError:
        previous = None
    plan = build_plan(run.report, run.rows, items=items, worst=worst, seed=seed, formats=formats, previous=previous)
    restored = None if plan is previous else _archived_like(run.run_dir, plan)
    plan = restored or plan  # the options that made a replaced plan: it comes back, with its key and judgments
    replaced = None
    if plan is previous:
        if not plan.salt:  # a plan of quantgate.review-plan/1: its key moves out of the plan, salted
            plan = replace(plan, salt=secrets.token_hex(16))
    else:
        pending = {plan_id: where for plan_id, where in known_judgments(run).items()
                   if plan_id != plan.plan and not archived_plan_path(run.run_dir, plan_id).is_file()}
        if pending and not new_plan:
            plan_id, where = next(iter(pending.items()))
            raise UserError(f"judgments already refer to review plan {plan_id} ({', '.join(where)}); a new plan "
                            "(these --items/--worst/--seed/--formats, or outputs that changed since) would leave "
                            f"them uncounted: repeat the options that made plan {plan_id}, or pass --new-plan to "
                            f"replace it (kept as {archived_plan_path(run.run_dir, plan_id).name})")
        replaced = archive_plan(run.run_dir)
        _set_aside_kept(run.run_dir, replaced)
        if restored is not None:
            kept = run.run_dir / f"{KEPT_DIR}-{restored.plan}"
            if kept.is_dir():
                kept.replace(run.run_dir / KEPT_DIR)
    write_plan(run.run_dir, plan)
    if restored is not None:
        archived_plan_path(run.run_dir, restored.plan).unlink(missing_ok=True)
        (run.run_dir / f"review-key-{restored.plan}.json").unlink(missing_ok=True)
    return Review(run, plan, replaced)


def _set_aside_kept(run_dir: Path, plan_id: str | None) -> None:
    """The judgments folded on a plan being replaced move aside with it (reviews-ID/)."""
    kept = run_dir / KEPT_DIR
    if not kept.is_dir() or not any(kept.iterdir()):
        return
    target = run_dir / f"{KEPT_DIR}-{plan_id or 'unplanned'}"
    number = 1
    while target.exists():
        number += 1
        target = run_dir / f"{KEPT_DIR}-{plan_id or 'unplanned'}-{number}"
    kept.replace(target)


def _archived_like(run_dir: Path, plan: ReviewPlan) -> ReviewPlan | None:
    """A replaced plan (review-plan-ID.json) with the same sample as `plan`, readable with its key."""
    for plan_id in archived_plans(run_dir):
        try:
            old = read_plan(run_dir, plan_id)
        except UserError:
            continue
        if old.same_sample(plan):
            return old
    return None


def known_judgments(run: RunData) -> dict[str, list[str]]:
    """plan id -> where judgments on it are: the run directory's review-*.jsonl, the folded ones (reviews/), and
    report.json's spot checks."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in [*sorted(run.run_dir.glob("review-*.jsonl")), *kept_files(run.run_dir)]:
        for plan_id in sorted(_plans_named(path)):
            found[plan_id].append(str(path.relative_to(run.run_dir)))
    for name, fmt in run.report.formats.items():
        if fmt.spot_checks is not None:
            found[fmt.spot_checks.plan].append(f"report.json: {name}'s spot checks")
    return dict(found)


def _plans_named(path: Path) -> set[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    plans = set()
    for line in text.split("\n"):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("plan"), str):
            plans.add(record["plan"])
    return plans


@dataclass(frozen=True)
class Folded:
    run: RunData
    report: Any  # RunReport
    plan: ReviewPlan
    plan_dir: Path  # where the plan was read: the run directory, or beside the first judgment file
    merged: Merged


def fold_into_run(run_dir: Path, review_files: list[Path], policy_file: Path | None = None) -> Folded:
    """The run's report with every judgment folded in (harness.review.fold): those folded before (reviews/) and
    these files', merged per reviewer (harness.review.store); under the run's policy or, with policy_file, the
    run's policy with that file's [spot_checks]. The plan is the run's own review-plan.json, or the one beside the
    first judgment file."""
    from harness.review.fold import fold_reviews
    from harness.review.judgments import read_judgment_lines
    from harness.review.store import merge

    run = load_run(run_dir)
    policy = spot_check_policy(run, policy_file) if policy_file else run_policy(run)
    plan_dir = run.run_dir if (run.run_dir / PLAN_FILE).is_file() else Path(review_files[0]).parent
    plan = read_plan(plan_dir)
    _refuse_replaced_plans(run.run_dir, plan, [Path(p) for p in review_files])
    kept = read_judgment_lines(kept_files(run.run_dir), plan, run.rows)
    merged = merge(kept, read_judgment_lines([Path(p) for p in review_files], plan, run.rows))
    judgments = [judgment for items in merged.lines.values() for judgment, _ in items.values()]
    return Folded(run, fold_reviews(run.report, run.rows, plan, judgments, policy), plan, plan_dir, merged)


def _refuse_replaced_plans(run_dir: Path, plan: ReviewPlan, files: list[Path]) -> None:
    """Judgments on a plan that `review` replaced since: say which, and how to bring it back."""
    for path in files:
        for plan_id in sorted(_plans_named(path) - {plan.plan}):
            if archived_plan_path(run_dir, plan_id).is_file():
                raise UserError(f"{path}: judged on review plan {plan_id}, which a later `quantgate review` replaced "
                                f"with {plan.plan} (kept as {archived_plan_path(run_dir, plan_id).name}): run "
                                f"`quantgate review {run_dir}` with the options that made plan {plan_id} to bring it "
                                "back, then fold these judgments")


def fold_and_write(run_dir: Path, review_files: list[Path], policy_file: Path | None = None,
                   say: Callable[[str], Any] = print):
    """Fold the judgments into the run, keep them (reviews/NAME.jsonl, and the plan when it came from beside the
    files) and write report.json; (the new report, the run directory). `say` gets the notes on what a file
    replaced or left. The renderings are the caller's (write_reports)."""
    from harness.cache import atomic_write_text
    from harness.report.schema import report_json
    from harness.review.store import write_kept

    folded = fold_into_run(run_dir, review_files, policy_file)
    run_dir = folded.run.run_dir
    if folded.plan_dir.resolve() != run_dir.resolve():
        write_plan(run_dir, folded.plan)
    write_kept(run_dir, folded.merged)
    atomic_write_text(run_dir / "report.json", report_json(folded.report))
    for note in folded.merged.notes:
        say(note)
    return folded.report, run_dir


def check_review_files(paths: list[Path]) -> None:
    """Before a run starts: every --reviews file is there and readable (its lines are checked against the run's
    outputs once they exist)."""
    for path in paths:
        if not Path(path).is_file():
            raise UserError(f"--reviews {path}: no such file; give the review-NAME.jsonl files the review page saved")


def run_policy(run: RunData):
    """The policy the run was decided under, as report.json keeps it (keys an older quantgate wrote and this one
    no longer reads are left out: they decided nothing spot checks change)."""
    from harness.policy import Policy, policy_from_dict

    kept = {k: v for k, v in run.report.policy.model_dump(mode="json", exclude_unset=True).items()
            if k in Policy.model_fields}
    return policy_from_dict(kept, source=f"{run.run_dir / 'report.json'}: policy")


def spot_check_policy(run: RunData, path: Path):
    """The run's policy with FILE's [spot_checks]; FILE may not differ from the run's policy anywhere else."""
    from harness.policy import load_policy

    given = load_policy(path)
    own = run_policy(run)
    changed = [key for key in own.model_fields if key != "spot_checks" and getattr(own, key) != getattr(given, key)]
    if changed:
        raise UserError(f"{path}: differs from the run's policy in {', '.join(changed)}; report --reviews folds only "
                        "[spot_checks]: rerun `quantgate run --policy FILE --resume` to re-decide the rest")
    return own.model_copy(update={"spot_checks": given.spot_checks})


def _item_inputs(report) -> dict[tuple[str, str], dict[str, str]]:
    """(evalset, id) -> the item's own fields, from its spec where the spec still holds the content the run scored;
    otherwise the page shows the rendered prompt."""
    from harness.evalsets import load_evalsets

    inputs: dict[tuple[str, str], dict[str, str]] = {}
    for name, info in report.evalsets.items():
        spec = Path(info.spec)
        if not spec.is_file():
            continue
        try:
            (evalset,) = load_evalsets([spec], allow_outside_paths=True)
        except (UserError, ValueError):
            continue
        if evalset.content_hash != info.hash:
            continue
        for item in evalset.items:
            inputs[(name, item.id)] = {"question": item.question, "context": item.context,
                                       "instruction": item.instruction}
    return inputs
