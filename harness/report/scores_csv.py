"""scores.csv: one row per format x evalset x item, for pandas or a spreadsheet.

Columns: format, evalset, id, new_tokens, then one column per metric, empty where a
metric does not apply to the item's evalset (QA and generation sets score different
metrics). Written with the csv module; pandas is not needed to write it.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from harness.report.schema import SAMPLE_FIELDS, RunReport
from harness.units import is_number

KEY_COLUMNS = ("format", "evalset", "id", "new_tokens")


def metric_columns(report: RunReport, samples: list[dict[str, Any]]) -> list[str]:
    """Metrics in evalset-spec order, then any other numeric field the samples carry."""
    columns: list[str] = []
    for spec in report.evalsets.values():
        for metric in spec.metrics:
            if metric not in columns and metric not in SAMPLE_FIELDS:
                columns.append(metric)
    seen = set(columns)
    for record in samples:
        for key, value in record.items():
            if key not in seen and key not in SAMPLE_FIELDS and is_number(value):
                seen.add(key)
                columns.append(key)
    return columns


def render_scores_csv(report: RunReport, samples: list[dict[str, Any]]) -> str:
    metrics = metric_columns(report, samples)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*KEY_COLUMNS, *metrics])
    for record in samples:
        writer.writerow([_cell(record.get(c)) for c in KEY_COLUMNS] + [_cell(record.get(m)) for m in metrics])
    return buffer.getvalue()


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and not is_number(value)):
        return ""
    if isinstance(value, float):
        return repr(value)  # shortest round-trip form
    return str(value)
