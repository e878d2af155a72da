"""Spot checks by people: a blinded review page, the judgments kept with the run, and their verdict.

    run dir (report.json, samples.jsonl) -> plan.build_plan -> review-plan.json + page.render (review.html)
    reviewer -> review-NAME.jsonl (saved from the page, or written by `quantgate review --serve`)
    judgments.read_judgments (checked against the plan and the run's outputs) -> summary.summarize -> rule
    (SpotCheckSummary, the [spot_checks] policy) -> the verdict (decide.fold_spot_checks) and the reports
"""
