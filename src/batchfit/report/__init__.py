"""Reports: one self-contained HTML page (inline SVG plots, no network) drawn from saved results."""

from __future__ import annotations

from batchfit.report.canvas import require_matplotlib
from batchfit.report.page import render_report, write_report
from batchfit.report.results import SavedResult, WhatRan, legacy_kind, read_result, recognise, saved_result

__all__ = [
    "SavedResult",
    "WhatRan",
    "legacy_kind",
    "read_result",
    "recognise",
    "render_report",
    "require_matplotlib",
    "saved_result",
    "write_report",
]
