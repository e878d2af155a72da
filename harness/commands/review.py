"""`quantgate review RUN_DIR`: the blinded review page for people's spot checks (harness.review)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "review",
        help="write review.html: people judge a blind sample of each format's outputs against the baseline's",
        description="Write RUN_DIR/review.html and RUN_DIR/review-plan.json: for a random sample of items per "
                    "candidate format (and optionally its worst items, shown apart and never counted), the input, "
                    "the reference and two outputs labelled A and B, the baseline's and the candidate's in an order "
                    "drawn at random per item and kept in RUN_DIR/review-key.json (give reviewers review.html only). "
                    "An item is shown for one format only. Reviewers mark which is better and whether each is "
                    "acceptable; Save writes review-NAME.jsonl. Fold the judgments into the verdict with "
                    "`quantgate report RUN_DIR --reviews RUN_DIR/review-*.jsonl`; every judgment folded is kept in "
                    "RUN_DIR/reviews/ and counted again by later folds.")
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the output directory of `quantgate run`")
    parser.add_argument("--items", type=int, default=20, metavar="N",
                        help="random items per candidate format, spread over its evalsets (default 20)")
    parser.add_argument("--worst", type=int, default=0, metavar="K",
                        help="also the K items with the largest task drop and the K with the largest fidelity KL, "
                             "per format: shown, never counted in the rates (default 0)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0); the A/B order is drawn "
                                                           "at random, not from it")
    parser.add_argument("--formats", metavar="A,B", help="only these candidate formats (default: every finished one)")
    parser.add_argument("--new-plan", action="store_true",
                        help="replace a review plan that judgments already refer to (they would no longer count; "
                             "the plan is kept as review-plan-ID.json, the judgments folded on it in reviews-ID/)")
    parser.add_argument("--serve", action="store_true",
                        help="serve the page on 127.0.0.1 and write the judgments into RUN_DIR when saved")
    parser.add_argument("--port", type=int, default=0, help="with --serve: the port on 127.0.0.1 (default: a free "
                                                           "one)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.review.session import open_review

    if args.items < 1:
        raise UserError(f"--items {args.items}: give at least 1 item per format")
    if args.worst < 0:
        raise UserError(f"--worst {args.worst}: give 0 or more")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: not a port; give 1 to 65535, or leave --port out for a free one")
    formats = [f.strip() for f in args.formats.split(",") if f.strip()] if args.formats else None
    review = open_review(args.run_dir, items=args.items, worst=args.worst, seed=args.seed, formats=formats,
                         new_plan=args.new_plan)
    page = review.write_page()
    counted = sum(1 for item in review.plan.items if item.stratum == "random")
    if review.replaced:
        print(f"replaced review plan {review.replaced}: kept as review-plan-{review.replaced}.json")
    for name in dict.fromkeys(item.format for item in review.plan.items):
        drawn = sum(1 for item in review.plan.items if item.format == name and item.stratum == "random")
        if drawn < args.items:
            print(f"{name}: {drawn} of {args.items} items: the run holds too few for every format, and an item is "
                  "shown for one format only (two formats' pairs would share its baseline output, unblinding it)")
    print(f"{page}: {len(review.plan.items)} item(s) to judge ({counted} in the random sample the rates use); plan "
          f"{review.plan.plan} in {review.plan_path} (its A/B key in review-key.json: do not give it to reviewers)")
    if not args.serve:
        print(f"open it in a browser, judge, Save; then: quantgate report {args.run_dir} --reviews "
              f"{args.run_dir}/review-NAME.jsonl")
        return 0
    return review.serve(args.port)
