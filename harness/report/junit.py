"""junit.xml: one testcase per format x check, so CI shows the verdicts natively.

fail -> <failure>, inconclusive -> <skipped> (the data cannot tell: neither pass nor
fail), pass -> an empty testcase. Built with ElementTree so the XML is always well
formed; characters XML 1.0 forbids (ANSI escapes in an error message) are dropped.
The failure and skipped messages are each check's own `reason` (schema version 2).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from harness.report.schema import Check, RunReport
from harness.report.view import ordered_format_names

_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _clean(value: Any) -> str:
    return _XML_INVALID.sub("", "" if value is None else str(value))


def testcases(report: RunReport) -> list[tuple[str, str, Check]]:
    """(format, testcase name, check); a failed format without a 'run' check gets one, so its error shows.

    A metric and its floor share a check name; CI tools merge testcases with the same
    classname and name, so a repeated name gets its kind appended.
    """
    cases = []
    for name in ordered_format_names(report):
        fmt = report.formats[name]
        checks = list(fmt.checks)
        if fmt.status == "failed" and not any(c.kind == "run" for c in checks):
            error = fmt.error or "the format failed without an error message"
            checks.insert(0, Check(name="run", kind="run", status="fail", detail=error, reason=error))
        seen: set[str] = set()
        for check in checks:
            case_name = _clean(check.name or "?")
            if case_name in seen:
                case_name = f"{case_name} ({_clean(check.kind)})"
            while case_name in seen:
                case_name += "'"
            seen.add(case_name)
            cases.append((name, case_name, check))
    return cases


def render_junit(report: RunReport) -> str:
    cases = testcases(report)
    statuses = [check.status for _, _, check in cases]
    suite = ET.Element(
        "testsuite",
        {
            "name": "quantgate",
            "tests": str(len(cases)),
            "failures": str(statuses.count("fail")),
            "errors": "0",  # the schema admits pass, fail and inconclusive only
            "skipped": str(statuses.count("inconclusive")),
            "time": f"{report.wall_s:.3f}",
        },
    )
    if report.created_at:
        suite.set("timestamp", _clean(report.created_at).removesuffix("Z"))
    properties = ET.SubElement(suite, "properties")
    for name in ordered_format_names(report):
        ET.SubElement(properties, "property", {"name": f"verdict.{_clean(name)}", "value": report.formats[name].verdict})
    recommended = report.recommendation.format
    ET.SubElement(properties, "property", {"name": "recommendation", "value": _clean(recommended or "none")})
    for name, case_name, check in cases:
        _add_testcase(suite, name, case_name, check)
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _add_testcase(suite: ET.Element, fmt_name: str, case_name: str, check: Check) -> None:
    case = ET.SubElement(suite, "testcase", {"classname": f"quantgate.{_clean(fmt_name)}", "name": case_name, "time": "0"})
    detail, reason = _clean(check.detail), _clean(check.reason)
    if check.status == "fail":
        message = reason or detail or "check failed"
        failure = ET.SubElement(case, "failure", {"message": message, "type": _clean(check.kind)})
        failure.text = detail or message
    elif check.status == "inconclusive":
        ET.SubElement(case, "skipped", {"message": "INCONCLUSIVE: " + (reason or detail)})
