"""A page as a person's browser shows it: Debian's Chromium, headless, driven through Playwright, opens a
file and tells what the page logged, threw and fetched, where its plots landed, and how much ink its
full-page screenshot holds."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from PIL import Image

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Request, Route

VIEWPORT = {"width": 1280, "height": 800}  # CSS pixels; the screenshot has one pixel per CSS pixel
# An A4 page's printable width at the CSS 96 px per inch: 210 mm less 1 cm margins on each side.
PRINTED = {"width": 718, "height": 1047}
# What this closed machine needs. Playwright adds --headless and a fresh, empty, temporary
# --user-data-dir itself (it refuses one passed here). The resolver rule fails every host name on the
# machine, so no lookup leaves it even before a request is aborted.
FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",
)
ON_THE_MACHINE = frozenset({"file", "data"})  # URL schemes a self-contained page may load
CONSOLE_KINDS = frozenset({"error", "warning"})


def find_chromium() -> str | None:
    """The path of Debian's ``chromium`` (``/usr/bin/chromium``), or None where it is not installed."""
    return shutil.which("chromium")


def why_no_browser() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if find_chromium() is None:
        return (
            "needs Debian's chromium, and there is no `chromium` on PATH (.ci/run installs it with apt-get)"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "needs playwright, which is not installed: pip install -e '.[dev]'"
    return None


@dataclass(frozen=True)
class Box:
    """A rendered element's box in CSS pixels, from the page's top left corner."""

    left: float
    top: float
    width: float
    height: float

    @property
    def right(self) -> float:
        return self.left + self.width


@dataclass(frozen=True)
class Visit:
    """What one page did when it was opened, and where its screenshot is."""

    url: str
    console: tuple[str, ...]  # "error: TEXT (URL:LINE)", lines from 1 for each console error or warning
    page_errors: tuple[str, ...]  # uncaught exceptions
    off_machine_requests: tuple[str, ...]  # every URL asked for that is not file: or data:, in order
    svg_boxes: tuple[Box, ...]  # each <svg>, in document order
    scroll_width: int  # document.documentElement.scrollWidth
    viewport_width: int  # document.documentElement.clientWidth
    screenshot: Path  # the full page, PNG


@dataclass(frozen=True)
class Ink:
    """How much of a picture differs from its background (its most common colour)."""

    share: float  # of the pixels, 0 to 1
    colours: int  # distinct colours, background included

    def blank(self) -> bool:
        """A page of one colour, or nearly: under 0.5 % of the pixels drawn, or under 8 colours.
        A report's plots and anti-aliased text give far more of both."""
        return self.share < 0.005 or self.colours < 8


def measure_ink(png: Path, box: Box | None = None) -> Ink:
    """The ink of the picture in ``png``, or of the part of it inside ``box``."""
    with Image.open(png) as opened:
        picture = opened.convert("RGB")
    if box is not None:
        picture = picture.crop(
            (round(box.left), round(box.top), round(box.right), round(box.top + box.height))
        )
    pixels = picture.width * picture.height
    counts = picture.getcolors(maxcolors=pixels) or []
    background = max((count for count, _ in counts), default=pixels)
    return Ink(share=1 - background / pixels if pixels else 0.0, colours=len(counts))


class Chromium:
    """One running headless Chromium; each visit opens its page in a fresh context (no cache or storage
    carried over from the last) and aborts every request that would leave the machine."""

    def __init__(self, browser: Browser) -> None:
        self._browser = browser

    def visit(self, html_path: Path, screenshot_path: Path, *, printed: bool = False) -> Visit:
        """Open ``html_path`` at a 1280 px wide viewport (``printed``: as printed on A4, the print
        style sheet at the page's printable width), wait for it and its fonts to load, and take a
        full-page screenshot into ``screenshot_path``."""
        console: list[str] = []
        page_errors: list[str] = []
        off_machine: list[str] = []

        def on_console(message: ConsoleMessage) -> None:
            if message.type in CONSOLE_KINDS:
                where = message.location
                console.append(f"{message.type}: {message.text} ({where['url']}:{where['lineNumber'] + 1})")

        def on_request(request: Request) -> None:
            if urlsplit(request.url).scheme not in ON_THE_MACHINE:
                off_machine.append(request.url)

        def keep_on_the_machine(route: Route) -> None:
            if urlsplit(route.request.url).scheme in ON_THE_MACHINE:
                route.continue_()
            else:
                route.abort("internetdisconnected")

        context = self._browser.new_context(viewport=PRINTED if printed else VIEWPORT, device_scale_factor=1)
        try:
            context.set_default_timeout(15_000)
            context.route("**/*", keep_on_the_machine)
            page = context.new_page()
            page.emulate_media(media="print" if printed else "screen")
            page.on("console", on_console)
            page.on("pageerror", lambda error: page_errors.append(f"{error.name}: {error.message}"))
            page.on("request", on_request)
            url = html_path.resolve().as_uri()
            page.goto(url, wait_until="load")
            page.evaluate("document.fonts.ready.then(() => true)")
            layout: dict[str, Any] = page.evaluate(_LAYOUT)
            page.screenshot(path=screenshot_path, full_page=True, animations="disabled")
        finally:
            context.close()
        return Visit(
            url=url,
            console=tuple(console),
            page_errors=tuple(page_errors),
            off_machine_requests=tuple(off_machine),
            svg_boxes=tuple(Box(**box) for box in layout["svgs"]),
            scroll_width=layout["scroll_width"],
            viewport_width=layout["viewport_width"],
            screenshot=screenshot_path,
        )


# Boxes in page coordinates (the viewport's plus its scroll offset), as the full-page screenshot has them.
_LAYOUT = """() => ({
    svgs: Array.from(document.querySelectorAll("svg"), (svg) => {
        const box = svg.getBoundingClientRect();
        return {left: box.left + window.scrollX, top: box.top + window.scrollY,
                width: box.width, height: box.height};
    }),
    scroll_width: document.documentElement.scrollWidth,
    viewport_width: document.documentElement.clientWidth,
})"""


@contextmanager
def open_chromium() -> Iterator[Chromium]:
    """Debian's Chromium, headless, for as long as the block runs."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=find_chromium(), args=FLAGS, headless=True)
        try:
            yield Chromium(browser)
        finally:
            browser.close()
