"""junit.xml: one testcase per format x check, so CI shows the verdicts natively.

fail -> <failure>, inconclusive -> <skipped> (the data cannot tell: neither pass nor
fail), pass -> an empty testcase. Built with ElementTree so the XML is always well
formed; characters XML 1.0 forbids (ANSI escapes in an error message) are dropped.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from harness.report.units import is_number
from harness.report.view import formats_in_order, verdict_of

_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _clean(value: Any) -> str:
    return _XML_INVALID.sub("", "" if value is None else str(value))


def testcases(report: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(format, testcase name, check); a failed format without a 'run' check gets one, so its error shows.

    A metric and its floor share a check name; CI tools merge testcases with the same
    classname and name, so a repeated name gets its kind appended.
    """
    cases = []
    for name, fmt in formats_in_order(report):
        checks = [c for c in fmt.get("checks") or [] if isinstance(c, dict)]
        if fmt.get("status") == "failed" and not any(c.get("kind") == "run" for c in checks):
            checks.insert(0, {"name": "run", "kind": "run", "status": "fail",
                              "detail": fmt.get("error") or "the format failed without an error message"})
        seen: set[str] = set()
        for check in checks:
            case_name = _clean(check.get("name") or "?")
            if case_name in seen:
                case_name = f"{case_name} ({_clean(check.get('kind') or 'check')})"
            while case_name in seen:
                case_name += "'"
            seen.add(case_name)
            cases.append((name, case_name, check))
    return cases


def render_junit(report: dict[str, Any]) -> str:
    cases = testcases(report)
    statuses = [check.get("status") for _, _, check in cases]
    suite = ET.Element(
        "testsuite",
        {
            "name": "quantgate",
            "tests": str(len(cases)),
            "failures": str(statuses.count("fail")),
            "errors": str(sum(1 for s in statuses if s not in ("pass", "fail", "inconclusive"))),
            "skipped": str(statuses.count("inconclusive")),
            "time": f"{report['wall_s']:.3f}" if is_number(report.get("wall_s")) else "0",
        },
    )
    if report.get("created_at"):
        suite.set("timestamp", _clean(report["created_at"]).removesuffix("Z"))
    properties = ET.SubElement(suite, "properties")
    for name, fmt in formats_in_order(report):
        ET.SubElement(properties, "property", {"name": f"verdict.{_clean(name)}", "value": verdict_of(fmt)})
    recommended = (report.get("recommendation") or {}).get("format")
    ET.SubElement(properties, "property", {"name": "recommendation", "value": _clean(recommended or "none")})

    for name, case_name, check in cases:
        case = ET.SubElement(suite, "testcase", {"classname": f"quantgate.{_clean(name)}", "name": case_name, "time": "0"})
        status = check.get("status")
        detail = _clean(check.get("detail"))
        if status == "fail":
            reason = _reason_for(report["formats"][name], check) or detail or "check failed"
            failure = ET.SubElement(case, "failure", {"message": reason, "type": _clean(check.get("kind") or "check")})
            failure.text = detail or reason
        elif status == "inconclusive":
            ET.SubElement(case, "skipped", {"message": "INCONCLUSIVE: " + (_reason_for(report["formats"][name], check) or detail)})
        elif status != "pass":
            ET.SubElement(case, "error", {"message": f"unknown check status {_clean(status)!r}: {detail}"})
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _reason_for(fmt: dict[str, Any], check: dict[str, Any]) -> str:
    """The verdict's reason line for this check (decide writes '<name>: <detail>'), else its detail."""
    name, detail = str(check.get("name") or ""), str(check.get("detail") or "")
    named = [str(r) for r in fmt.get("reasons") or [] if name and str(r).startswith(name)]
    for reason in named:
        if detail and detail in reason:
            return _clean(reason)
    # reasons are written for non-passing checks only: one reason, one such check -> it is this one's
    open_same_name = [c for c in fmt.get("checks") or []
                      if isinstance(c, dict) and c.get("name") == name and c.get("status") != "pass"]
    if len(named) == 1 and len(open_same_name) == 1:
        return _clean(named[0])
    return _clean(detail)
