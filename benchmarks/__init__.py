"""Speed benchmarks (`nox -s bench` runs benchmarks/run.py); results go to reports/bench/latest.md."""
