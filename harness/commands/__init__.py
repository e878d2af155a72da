"""CLI subcommands: each module has add_parser(subparsers) and run(args) -> exit code."""

COMMANDS = ["run", "plan", "decide", "compare", "report", "review", "diagnose", "evalsets", "cache", "schema"]
