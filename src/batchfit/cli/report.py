"""``batchfit report``: one HTML page with plots from saved results (``--format json --output``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from batchfit import ConfigurationError
from batchfit.cli.flags import check_folder
from batchfit.report import read_result, require_matplotlib, write_report


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "report",
        help="an HTML page with plots from saved results",
        description=(
            "Render saved results (what find, explore or plan write with --format json --output FILE) "
            "as one self-contained HTML page: inline plots, no network, printable."
        ),
    )
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULT.json", help="saved results")
    parser.add_argument(
        "-o", "--output", type=Path, required=True, metavar="FILE.html", help="the page to write"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    require_matplotlib()
    missing = [str(path) for path in args.results if not path.is_file()]
    if missing:
        raise ConfigurationError(
            f"no such result file: {', '.join(missing)}; pass what a command wrote with "
            f"--format json --output FILE."
        )
    check_folder("--output", args.output)
    write_report([read_result(path) for path in args.results], args.output)
    return 0
