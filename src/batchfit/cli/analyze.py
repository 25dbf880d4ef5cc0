"""``batchfit analyze``: the batch sizes of an experiment config at several memory fractions."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from batchfit.analyze import REPORT_FORMATS, analyze
from batchfit.autobatch import bounds_from_config, workload_from_config
from batchfit.cli import flags
from batchfit.config import ExperimentConfig, load_config
from batchfit.errors import ConfigurationError
from batchfit.policy.trial import Mode


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
    parser.add_argument(
        "--modes", default="train,val", help="comma-separated: train, val (default: %(default)s)"
    )
    parser.add_argument("--output", type=Path, default=None, help="report.json, report.jsonl or report.csv")
    flags.add_report(parser)
    flags.add_ranks(parser)
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY VALUE",
        help="config overrides, e.g. DATA.AUTOBATCH.STEPS_PER_TRIAL 3",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.cfg, args.overrides)
    fractions = _parse_fractions(args.fractions)
    modes = flags.parse_modes(args.modes)
    suffix = args.output.suffix.lower().lstrip(".") if args.output is not None else None
    if suffix is not None and suffix not in REPORT_FORMATS:
        raise ConfigurationError(f"--output {str(args.output)!r} must end in .json, .jsonl or .csv.")
    return flags.run_launched(args, cfg.DEVICE, lambda: _run(args, cfg, fractions, modes, suffix))


def _run(
    args: argparse.Namespace,
    cfg: ExperimentConfig,
    fractions: list[float],
    modes: list[Mode],
    suffix: str | None,
) -> int:
    workload = workload_from_config(cfg)
    with flags.progress(args, "analyze") as display:
        analysis = analyze(
            workload,
            fractions,
            modes,
            bounds=bounds_from_config(cfg),
            device=cfg.DEVICE,
            memory_limit=cfg.MEMORY_LIMIT,
            on_trial=lambda fraction, mode, trial: display.trial(f"{mode}@{fraction:g}", trial),
        )
    flags.say(
        f"{analysis.trials_run} real trials for {len(analysis.rows)} searches "
        f"({analysis.separate_trials} if run separately), {analysis.traces_run} fake-tensor traces "
        f"({analysis.separate_traces} if run separately)."
    )
    document = {**analysis.to_dict(), **flags.what_ran(workload.name)}
    rendered = (
        json.dumps(document, indent=2) + "\n" if suffix == "json" else analysis.render(suffix or "table")
    )
    flags.emit(rendered, args.output)
    flags.write_report(args, document)
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
