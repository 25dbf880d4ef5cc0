"""``batchfit analyze``: the batch sizes of an experiment config at several memory fractions."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import batchfit
from batchfit import ConfigurationError, Where
from batchfit.analysis.apply_autobatch import analyze_config
from batchfit.analysis.config import ExperimentConfig
from batchfit.cli import flags
from batchfit.policy.search.trial import Mode

FORMATS = ("text", "json", "jsonl", "csv")


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "analyze",
        help="batch sizes at several memory fractions, from an experiment config",
        description="Run the search outside training for each fraction and mode of an experiment config.",
    )
    parser.add_argument("--cfg", type=Path, required=True, help="the experiment config (YAML)")
    parser.add_argument(
        "--fractions", default="0.8", help="comma-separated memory fractions (default: %(default)s)"
    )
    flags.add_modes(parser)
    flags.add_output(parser, FORMATS)
    flags.add_ranks(parser)
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY VALUE",
        help="config overrides, e.g. DATA.AUTOBATCH.STEPS_PER_TRIAL 3",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    cfg = batchfit.load_config(args.cfg, args.overrides)
    fractions = _parse_fractions(args.fractions)
    modes = flags.parse_modes(args.modes)
    where = Where(cfg.DEVICE, cfg.MEMORY_LIMIT)
    return flags.run_launched(args, where, lambda: _run(args, cfg, fractions, modes))


def _run(args: argparse.Namespace, cfg: ExperimentConfig, fractions: list[float], modes: list[Mode]) -> int:
    workload = batchfit.load_workload(cfg.WORKLOAD, device=cfg.DEVICE, source="WORKLOAD")
    with flags.progress(args, "analyze") as display:
        analysis = analyze_config(cfg, workload, fractions, modes, on_progress=display.hear)
    flags.say(analysis.summary())
    document = flags.envelope(args, workload.name, [analysis])
    flags.publish(
        args, document, {"text": analysis.table, "jsonl": analysis.to_jsonl, "csv": analysis.to_csv}
    )
    return 0


def _parse_fractions(text: str) -> list[float]:
    try:
        fractions = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        fractions = []
    if not fractions or not all(0 < fraction <= 1 for fraction in fractions):
        raise ConfigurationError(
            f"--fractions {text!r}: give comma-separated numbers in (0, 1], e.g. 0.6,0.8."
        )
    return list(dict.fromkeys(fractions))
