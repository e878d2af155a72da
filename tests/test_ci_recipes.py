"""The CI recipes in examples/ci/ (docs/ci.md) parse, and every `quantgate` command in them is a valid invocation of
this version: argparse accepts it (a renamed or removed flag fails here before a user's pipeline does)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from harness import cli

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "examples" / "ci"


def _scripts(node) -> list[str]:
    """Every shell text in a parsed workflow: GitHub `run:` values, GitLab `script:` / `before_script:` items."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "run" and isinstance(value, str):
                found.append(value)
            elif key in ("script", "before_script") and isinstance(value, list):
                found += [v for v in value if isinstance(v, str)]
            else:
                found += _scripts(value)
    elif isinstance(node, list):
        for value in node:
            found += _scripts(value)
    return found


def _quantgate_commands(script: str) -> list[list[str]]:
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line.startswith("quantgate "):
            continue
        line = re.split(r"\s(?:\|\||&&|;)\s", line)[0]  # `quantgate run ... || code=$?`
        line = re.sub(r"\$\(date[^)]*\)", "2026-01-01", line)
        line = re.sub(r"\$\{?(\w+)\}?", lambda m: f"/placeholder/{m.group(1).lower()}", line)
        commands.append(shlex.split(line))
    return commands


@pytest.mark.parametrize("name", ["github-actions.yml", "gitlab-ci.yml"])
def test_recipe_parses_and_its_quantgate_commands_are_valid(name):
    recipe = yaml.safe_load((RECIPES / name).read_text())
    commands = [c for script in _scripts(recipe) for c in _quantgate_commands(script)]
    assert {c[1] for c in commands} == {"run", "compare"}, commands
    parser = cli.build_parser()
    for argv in commands:
        args = parser.parse_args(argv[1:])  # argparse exits (SystemExit 2) on an unknown flag or a bad value
        assert args.command == argv[1]
    outs = {c[c.index("--out") + 1] for c in commands if c[1] == "run"}
    text = (RECIPES / name).read_text()
    assert "quantgate-report" in outs  # the gate's run directory is what the recipe publishes
    assert "quantgate-report/junit.xml" in text and "quantgate-report/summary.md" in text

def test_github_workflow_publishes_before_it_fails():
    workflow = yaml.safe_load((RECIPES / "github-actions.yml").read_text())
    steps = workflow["jobs"]["gate"]["steps"]
    names = [s.get("name", s.get("uses", "")) for s in steps]
    fail = names.index("Fail unless every format is GO")
    for publishing in ("Job summary", "Comment on the pull request", "Upload the run directory", "Publish junit.xml"):
        assert names.index(publishing) < fail and steps[names.index(publishing)]["if"].startswith("always()")
    assert "GITHUB_STEP_SUMMARY" in steps[names.index("Job summary")]["run"]
    assert set(workflow[True] if True in workflow else workflow["on"]) >= {"pull_request", "schedule"}


def test_gitlab_job_reports_junit_and_keeps_artifacts():
    recipe = yaml.safe_load((RECIPES / "gitlab-ci.yml").read_text())
    gate = recipe["quantgate-gate"]
    assert gate["artifacts"]["when"] == "always" and gate["artifacts"]["reports"]["junit"] == "quantgate-report/junit.xml"
    assert recipe["quantgate-regression"]["rules"][0]["if"] == '$CI_PIPELINE_SOURCE == "schedule"'


def test_the_examples_in_quantgate_help_are_valid_invocations():
    parser = cli.build_parser()
    lines = [line.strip() for line in cli.EXAMPLES.splitlines() if line.strip().startswith("quantgate ")]
    assert {line.split()[1] for line in lines} >= {"run", "plan", "decide", "compare", "report", "review", "diagnose",
                                                  "evalsets", "cache", "schema"}
    for line in lines:
        argv = shlex.split(line.split("  then:")[0].split(" > ")[0])
        assert parser.parse_args(argv[1:]).command == argv[1]
