"""The review of one run directory: its report, its samples, its plan; the page, the server, the fold."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.review.plan import PLAN_FILE, ReviewPlan, build_plan, read_plan, write_plan

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
        from harness.review.judgments import read_judgments
        from harness.review.server import make_server, serve_in_thread

        server = make_server(self.run.run_dir, self.page(serve=True),
                             lambda path: read_judgments([path], self.plan, self.run.rows), port)
        host, bound = server.server_address[:2]
        print(f"serving the review page at http://{host}:{bound}/ ; judgments are written to {self.run.run_dir} "
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


def open_review(run_dir: Path, *, items: int, worst: int, seed: int, formats: list[str] | None,
                new_plan: bool) -> Review:
    run = load_run(run_dir)
    plan = build_plan(run.report, run.rows, items=items, worst=worst, seed=seed, formats=formats)
    existing = run.run_dir / PLAN_FILE
    if existing.is_file() and not new_plan:
        try:
            old = read_plan(run.run_dir)
        except UserError:
            old = None
        judged = sorted(p.name for p in run.run_dir.glob("review-*.jsonl"))
        if old is not None and old.plan != plan.plan and judged:
            raise UserError(f"{existing}: judgments already refer to its plan {old.plan} ({', '.join(judged)}); a "
                            f"new plan (these --items/--worst/--seed/--formats, or changed outputs) would leave them "
                            "uncounted: repeat the original options, or pass --new-plan to replace it")
    write_plan(run.run_dir, plan)
    return Review(run, plan)


def fold_into_run(run_dir: Path, review_files: list[Path], policy_file: Path | None = None):
    """The run's report with these judgment files folded in (harness.review.fold), under the run's policy or, with
    policy_file, the run's policy with that file's [spot_checks]; the plan is the run's own review-plan.json, or
    the one beside the first judgment file."""
    from harness.review.fold import fold_reviews
    from harness.review.judgments import read_judgments

    run = load_run(run_dir)
    policy = spot_check_policy(run, policy_file) if policy_file else run_policy(run)
    plan_dir = run.run_dir if (run.run_dir / PLAN_FILE).is_file() else Path(review_files[0]).parent
    plan = read_plan(plan_dir)
    judgments = read_judgments([Path(p) for p in review_files], plan, run.rows)
    return run, fold_reviews(run.report, run.rows, plan, judgments, policy)


def fold_and_write(run_dir: Path, review_files: list[Path], policy_file: Path | None = None):
    """Fold the judgments into the run and write report.json; (the new report, the run directory). The
    renderings are the caller's (write_reports)."""
    from harness.cache import atomic_write_text
    from harness.report.schema import report_json

    run, report = fold_into_run(run_dir, review_files, policy_file)
    atomic_write_text(run.run_dir / "report.json", report_json(report))
    return report, run.run_dir


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
