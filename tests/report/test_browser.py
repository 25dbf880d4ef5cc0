"""The report in a real browser: each page, rendered from real saved results, opens in headless Chromium
offline, logs and throws nothing, lays every plot out inside a 1280 px window, and its screenshot is not
blank. Screenshots go to $BATCHFIT_SCREENSHOTS when it is set, for a person to look at."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import Chromium, measure_ink, open_chromium, why_no_browser

from batchfit.report import render_report

_REASON = why_no_browser()
pytestmark = [pytest.mark.browser, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

# Each page, as the fixtures of tests/report/conftest.py that give its saved results. A new kind of
# result is one fixture there and one line here; the page of all of them gathers it by itself.
PAGES: dict[str, tuple[str, ...]] = {
    "find": ("find_result",),
    "explore": ("explore_result",),
    "explore-one-point": ("explore_one_point_result",),
    "explore-goodput": ("explore_goodput_result",),
    "plan": ("plan_result",),
    "analyze": ("analyze_result",),
    "compare": ("compare_result",),
    "check-data": ("check_data_result",),
    "advise": ("advise_result",),
    "noise-scale": ("noise_scale_result",),
    "noise-prediction": ("noise_prediction_result",),
    "predict": ("predict_result",),
}
PAGES["all"] = tuple(name for names in PAGES.values() for name in names)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    with open_chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    named = os.environ.get("BATCHFIT_SCREENSHOTS")
    if not named:
        return tmp_path_factory.mktemp("screenshots")
    Path(named).mkdir(parents=True, exist_ok=True)
    return Path(named)


@pytest.mark.parametrize("printed", [False, True], ids=["screen", "printed"])
@pytest.mark.parametrize("page", PAGES)
def test_the_page_opens_offline_quietly_with_every_plot_drawn_inside_the_window(
    page: str,
    printed: bool,
    chromium: Chromium,
    screenshots: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    results = [request.getfixturevalue(name) for name in PAGES[page]]
    text = render_report(results, created_at="2025-01-01T00:00:00+00:00")
    (tmp_path / f"{page}.html").write_text(text)
    shot = screenshots / f"{page}{'-printed' if printed else ''}.png"
    visit = chromium.visit(tmp_path / f"{page}.html", shot, printed=printed)
    assert visit.console == ()
    assert visit.page_errors == ()
    assert visit.off_machine_requests == ()
    assert visit.scroll_width <= visit.viewport_width == (718 if printed else 1280)  # nothing cut off
    assert len(visit.svg_boxes) == text.count("<svg") > 0  # each plot of the source laid out
    for box in visit.svg_boxes:
        assert box.width > 0 and box.height > 0, box
        assert 0 <= box.left and box.right <= visit.viewport_width, box
        assert not measure_ink(visit.screenshot, box).blank(), box  # the plot is drawn, not just placed
    assert not measure_ink(visit.screenshot).blank()


def test_console_errors_warnings_and_uncaught_exceptions_are_reported(
    chromium: Chromium, tmp_path: Path
) -> None:
    page = tmp_path / "throws.html"
    page.write_text(
        "<!DOCTYPE html>\n<html><body><p>text</p>\n"
        '<script>console.error("broken"); console.warn("careful"); console.log("fine");\n'
        'throw new TypeError("uncaught");</script></body></html>\n'
    )
    visit = chromium.visit(page, tmp_path / "throws.png")
    assert visit.console == (f"error: broken ({visit.url}:3)", f"warning: careful ({visit.url}:3)")
    assert visit.page_errors == ("TypeError: uncaught",)


def test_requests_off_the_machine_are_reported_and_never_leave_it(chromium: Chromium, tmp_path: Path) -> None:
    page = tmp_path / "fetches.html"
    page.write_text(
        '<!DOCTYPE html>\n<html><head><link rel="stylesheet" href="https://example.invalid/style.css">'
        '</head><body><img src="http://example.invalid/x.png"><img src="data:image/gif;base64,'
        'R0lGODlhAQABAAAAACH5BAEKAAEALAAAAAABAAEAAAICTAEAOw=="></body></html>\n'
    )
    visit = chromium.visit(page, tmp_path / "fetches.png")
    assert sorted(visit.off_machine_requests) == [
        "http://example.invalid/x.png",
        "https://example.invalid/style.css",
    ]
    failed = "error: Failed to load resource: net::ERR_INTERNET_DISCONNECTED"
    assert sorted(visit.console) == [
        f"{failed} (http://example.invalid/x.png:1)",
        f"{failed} (https://example.invalid/style.css:1)",
    ]


def test_overflow_and_an_empty_plot_are_seen(chromium: Chromium, tmp_path: Path) -> None:
    page = tmp_path / "overflows.html"
    page.write_text(
        '<!DOCTYPE html>\n<html><body><svg width="0" height="0"></svg>'
        '<svg width="1500" height="20"><rect width="1500" height="20" fill="white"/></svg></body></html>\n'
    )
    visit = chromium.visit(page, tmp_path / "overflows.png")
    [empty, wide] = visit.svg_boxes
    assert (empty.width, empty.height) == (0, 0)
    assert wide.right > visit.viewport_width == 1280 < visit.scroll_width
    assert measure_ink(visit.screenshot, wide).blank()  # placed, but nothing drawn


@pytest.mark.parametrize(
    "body",
    ["", '<div style="background: #fff; height: 3000px"></div>', '<body style="background: #888">'],
    ids=["empty", "tall-white", "grey"],
)
def test_a_page_of_one_colour_is_blank(body: str, chromium: Chromium, tmp_path: Path) -> None:
    page = tmp_path / "blank.html"
    page.write_text(f"<!DOCTYPE html>\n<html>{body}</html>\n")
    ink = measure_ink(chromium.visit(page, tmp_path / "blank.png").screenshot)
    assert (ink.share, ink.colours, ink.blank()) == (0.0, 1, True)


def test_a_line_of_text_is_too_little_ink_for_a_report(chromium: Chromium, tmp_path: Path) -> None:
    page = tmp_path / "line.html"
    page.write_text("<!DOCTYPE html>\n<html><body><h1>batchfit report</h1></body></html>\n")
    ink = measure_ink(chromium.visit(page, tmp_path / "line.png").screenshot)
    assert 0 < ink.share < 0.005 and ink.colours > 8
    assert ink.blank()
