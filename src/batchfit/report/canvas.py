"""What every plot of a report draws on: a matplotlib figure (imported lazily) sized per panel, the
shared axes and legend, and the figure as SVG text to inline in the page."""

from __future__ import annotations

import io
import math
import re
from typing import TYPE_CHECKING

from batchfit.errors import ConfigurationError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MISSING = "the report needs matplotlib, which is not installed: pip install 'batchfit[report]'"
_PANEL_INCHES = (5.6, 4.0)


def require_matplotlib() -> None:
    """Raise a ConfigurationError naming the extra to install when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise ConfigurationError(MISSING) from error


def new_figure(panels: int, *, height: float = _PANEL_INCHES[1]) -> Figure:
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(_PANEL_INCHES[0] * panels, height), layout="constrained")


def legend_below(axes: Axes, columns: int = 2) -> None:
    """The legend under the axes, where it covers no data point, line or label."""
    axes.legend(
        fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=columns, frameon=False
    )


def bytes_axis(axes: Axes, top: float) -> None:
    """Ticks at round binary sizes (8 MiB, 16 MiB, ... rather than 9.54 MiB), labelled as bytes."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    limit = top * 1.08
    unit = 1024 ** max(0, min(4, int(math.log(max(top, 1.0), 1024))))  # KiB, MiB, GiB ...
    ticks = MaxNLocator(nbins=6, steps=[1, 2, 4, 8, 10]).tick_values(0, limit / unit)
    axes.set_yticks([tick * unit for tick in ticks if 0 <= tick * unit <= limit])
    axes.set_ylim(0, limit)
    name = {1: "B", 1024: "KiB", 1024**2: "MiB", 1024**3: "GiB", 1024**4: "TiB"}[unit]
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: _tick_bytes(value, unit, name)))


def _tick_bytes(value: float, unit: int, name: str) -> str:
    """A round size, without format_bytes's decimals: 16 MiB, 0.5 GiB."""
    return f"{value / unit:g} {name}" if value else "0"


def batch_size_axis(axes: Axes) -> None:
    """A log-2 batch-size axis labelled with the sizes themselves (64, 128), not powers of two."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.xaxis.set_minor_formatter(NullFormatter())


def to_svg(figure: Figure, salt: str) -> str:
    """The figure as an ``<svg>`` element to inline in HTML: no XML prolog, doctype, metadata or
    namespace URLs; ids salted so that several figures on one page do not share them."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.DOTALL)
    return re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", text)
