"""The ``batchfit`` command line: parse, call the public API, render. One function per subcommand."""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import batchfit
from batchfit.errors import BatchfitError, ConfigurationError
from batchfit.examples import EXAMPLES, build_example
from batchfit.find import DEFAULT_MAX_BATCH, SearchResult, find_batch_size
from batchfit.search import Candidates, Trial
from batchfit.trial import Mode
from batchfit.units import format_bytes
from batchfit.workload import Workload, load_workload

DEBUG_VARIABLE = "BATCHFIT_DEBUG"

#: The library's errors name its parameters; on the command line they are said as the flags that
#: set them. Per subcommand: parameter -> flag.
_SHARED_FLAGS = {
    "min_batch": "--min-batch",
    "max_batch": "--max-batch",
    "multiple_of": "--multiple-of",
    "fraction": "--fraction",
    "device": "--device",
    "memory_limit": "--memory-limit",
}
CLI_FLAGS: dict[str, dict[str, str]] = {
    "find": {**_SHARED_FLAGS, "steps_per_trial": "--steps-per-trial"},
    "explore": {
        **_SHARED_FLAGS,
        "tolerance": "--tolerance",
        "objective": "--objective",
        "confidence_target": "--confidence",
        "base_batch": "--base-batch",
        "global_batch": "--global-batch",
        "world_size": "--devices",
        "windows": "--windows",
        "steps_per_window": "--steps-per-window",
        "time_budget": "--time-budget",
    },
    "plan": {
        "global_batch_size": "--global-batch",
        "world_size": "--devices",
        "max_micro_batch_size": "--max-micro-batch",
        "micro_batch_size": "--micro-batch",
        "base_learning_rate": "--base-lr",
        "base_batch_size": "--base-batch",
        "scaling_rule": "--rule",
        "warmup_steps": "--warmup-steps",
        "steps_per_epoch": "--steps-per-epoch",
        "weight_decay": "--weight-decay",
        "scale_weight_decay": "--scale-weight-decay",
    },
}


def in_cli_terms(message: str, command: str) -> str:
    """``message`` with the API's parameter names said as ``command``'s flags. A name with an
    underscore is a parameter wherever it stands; a plain word (``fraction``, ``device``) only
    where it opens the message or is followed by ``=``, as words such as "device" are also prose."""
    flags = CLI_FLAGS.get(command, {})
    if not flags:
        return message
    names = "|".join(re.escape(name) for name in sorted(flags, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.-])({names})(?![\w-])(=?)")

    def said(match: re.Match[str]) -> str:
        name, equals = match.group(1), match.group(2)
        if "_" in name or equals or match.start() == 0:
            return flags[name] + equals
        return match.group(0)

    return pattern.sub(said, message)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchfit",
        description="Find the batch size to train and evaluate with on this hardware.",
    )
    parser.add_argument("--version", action="version", version=f"batchfit {batchfit.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    find = commands.add_parser(
        "find",
        help="the largest memory-safe batch size for training and evaluation",
        description="Find the largest batch whose train (and eval) step fits a fraction of device memory.",
    )
    _add_source(find)
    find.add_argument(
        "--modes", default="train,eval", help="comma-separated: train, eval (default: %(default)s)"
    )
    find.add_argument(
        "--fraction",
        type=float,
        default=0.8,
        help="share of device memory to use (default: %(default)s)",
    )
    find.add_argument("--min-batch", type=int, default=1, help="lower bound (default: %(default)s)")
    find.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help=f"upper bound for train (default: {DEFAULT_MAX_BATCH['train']}); eval's is twice it",
    )
    find.add_argument("--steps-per-trial", type=int, default=2, help="steps per trial (default: %(default)s)")
    find.add_argument(
        "--multiple-of", type=int, default=None, help="only batch sizes that are multiples of N"
    )
    find.add_argument(
        "--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)"
    )
    find.add_argument(
        "--memory-limit",
        default=None,
        help="a capacity such as 2GiB: the device's memory is capped there (a smaller GPU, or a CPU as one)",
    )
    _add_output(find, ("text", "json"))
    find.set_defaults(handler=_find)
    explore = commands.add_parser(
        "explore",
        help="training throughput against batch size, with a recommendation",
        description="Measure training throughput up to the memory-safe maximum and recommend a micro-batch.",
    )
    _add_source(explore)
    explore.add_argument("--device", default=None, help="cpu, cuda or cuda:N")
    explore.add_argument(
        "--memory-limit", default=None, help="a capacity such as 2GiB: the device's memory is capped there"
    )
    explore.add_argument(
        "--fraction", type=float, default=0.8, help="memory fraction for the bound (default: %(default)s)"
    )
    explore.add_argument(
        "--min-batch", type=int, default=1, help="smallest batch to measure (default: %(default)s)"
    )
    explore.add_argument(
        "--max-batch", type=int, default=None, help="largest (default: the memory-safe maximum)"
    )
    explore.add_argument(
        "--tolerance",
        type=float,
        default=0.03,
        help="within this of the best counts as as fast (default: %(default)s)",
    )
    explore.add_argument(
        "--objective",
        choices=("smallest-within-tolerance", "max-throughput"),
        default="smallest-within-tolerance",
    )
    explore.add_argument(
        "--base-batch", type=int, default=None, help="the speed-up's base (default: the smallest measured)"
    )
    explore.add_argument("--devices", type=int, default=1, help="world size, with --global-batch")
    explore.add_argument(
        "--global-batch", type=int, default=None, help="the micro-batch must divide global-batch / devices"
    )
    explore.add_argument(
        "--multiple-of", type=int, default=None, help="only micro-batches that are multiples of N"
    )
    explore.add_argument(
        "--windows",
        type=int,
        default=3,
        help="timing windows per batch size in the coarse pass; contenders get more (default: %(default)s)",
    )
    explore.add_argument(
        "--steps-per-window",
        type=int,
        default=None,
        help="steps per window (default: the fewest that last 20 ms)",
    )
    explore.add_argument("--time-budget", type=float, default=None, help="stop after this many seconds")
    explore.add_argument(
        "--confidence",
        type=int,
        default=90,
        help="the confidence asked of the recommendation; stop once it is reached (default: %(default)s)",
    )
    _add_output(explore, ("text", "json", "csv"))
    explore.set_defaults(handler=_explore)
    analyze = commands.add_parser(
        "analyze",
        help="batch sizes at several memory fractions, from an experiment config",
        description="Run the search outside training for each fraction and mode of an experiment config.",
    )
    analyze.add_argument("--cfg", type=Path, required=True, help="the experiment config (YAML)")
    analyze.add_argument(
        "--fractions", default="0.8", help="comma-separated memory fractions (default: %(default)s)"
    )
    analyze.add_argument(
        "--modes", default="train,val", help="comma-separated: train, val (default: %(default)s)"
    )
    analyze.add_argument("--output", type=Path, default=None, help="report.json, report.jsonl or report.csv")
    analyze.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY VALUE",
        help="config overrides, e.g. DATA.AUTOBATCH.STEPS_PER_TRIAL 3",
    )
    analyze.set_defaults(handler=_analyze)
    plan = commands.add_parser(
        "plan",
        help="micro-batch, accumulation, learning rate and warm-up for a target global batch",
        description="Split a global batch over devices and scale the learning rate to it (no model is run).",
    )
    plan.add_argument("--global-batch", type=int, required=True, help="global_batch_size to train with")
    plan.add_argument("--devices", type=int, default=1, help="world_size (default: %(default)s)")
    plan.add_argument(
        "--max-micro-batch", type=int, default=None, help="the largest micro_batch_size that fits a device"
    )
    plan.add_argument("--micro-batch", type=int, default=None, help="force this micro_batch_size")
    plan.add_argument(
        "--base-lr", type=float, required=True, help="base_learning_rate, tuned at --base-batch"
    )
    plan.add_argument("--base-batch", type=int, required=True, help="base_batch_size of --base-lr")
    plan.add_argument(
        "--rule",
        choices=("linear", "sqrt"),
        default="linear",
        help="learning-rate scaling rule (default: %(default)s)",
    )
    plan.add_argument("--warmup-steps", type=int, default=None, help="default: recommended")
    plan.add_argument(
        "--steps-per-epoch", type=int, default=None, help="optimizer steps per epoch (caps the warm-up)"
    )
    plan.add_argument("--weight-decay", type=float, default=None, help="weight_decay at --base-batch")
    plan.add_argument(
        "--scale-weight-decay", action="store_true", help="scale --weight-decay by sqrt(global / base)"
    )
    plan.add_argument("--batchnorm", action="store_true", help="the model uses BatchNorm")
    plan.add_argument("--ema", action="store_true", help="the training keeps an EMA of the weights")
    plan.add_argument("--fine-tuning", action="store_true", help="fine-tuning a pre-trained model")
    plan.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="output format (default: %(default)s)",
    )
    plan.set_defaults(handler=_plan)
    return parser


def _workload(args: argparse.Namespace) -> Workload:
    """The workload, built on the device the search runs on (--device, else cuda if available)."""
    if args.example:
        return build_example(args.example, args.device)
    return load_workload(args.workload, device=args.device, source="--workload")


def _emit(text: str, output: Path | None) -> None:
    """The result to ``--output`` (saying so on stderr) or to stdout."""
    if output is not None:
        output.write_text(text)
        print(f"batchfit: wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def _add_source(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--example", choices=sorted(EXAMPLES), help="a built-in workload")
    source.add_argument(
        "--workload", metavar="MODULE:FUNCTION", help="a function returning a batchfit.Workload"
    )


def _add_output(parser: argparse.ArgumentParser, formats: tuple[str, ...]) -> None:
    parser.add_argument(
        "--format", choices=formats, default="text", help="output format (default: %(default)s)"
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="write the result to this file instead of stdout"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    debug = os.environ.get(DEBUG_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")
    try:
        return int(args.handler(args))
    except (BatchfitError, OSError) as error:
        if debug:
            traceback.print_exc()
        message = in_cli_terms(str(error), args.command) if isinstance(error, BatchfitError) else str(error)
        print(f"batchfit: error: {message}", file=sys.stderr)
        if not debug:
            print(f"(set {DEBUG_VARIABLE}=1 to see the traceback)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "batchfit: interrupted; the model and optimizer were left as they were.",
            file=sys.stderr,
        )
        return 130


def _find(args: argparse.Namespace) -> int:
    modes = _parse_modes(args.modes)
    train_max = args.max_batch if args.max_batch is not None else DEFAULT_MAX_BATCH["train"]
    Candidates.between(args.min_batch, train_max, args.multiple_of)  # bad bounds fail before any work
    workload = _workload(args)
    results: list[SearchResult] = []
    for mode in modes:
        result = find_batch_size(
            workload,
            mode,
            device=args.device,
            memory_limit=args.memory_limit,
            fraction=args.fraction,
            min_batch=args.min_batch,
            max_batch=train_max if mode == "train" else 2 * train_max,
            multiple_of=args.multiple_of,
            steps_per_trial=args.steps_per_trial,
            on_trial=functools.partial(_print_trial, mode),
            on_trial_start=functools.partial(_show_candidate, mode),
        )
        print(f"batchfit: {result.summary()}", file=sys.stderr)
        results.append(result)
    text = _render(workload, results, args.format)
    _emit(text, args.output)
    return 0


def _explore(args: argparse.Namespace) -> int:
    import torch

    from batchfit.choose import Recommendation
    from batchfit.device import PINNED_MALLOC, malloc_thresholds_move
    from batchfit.explore import explore

    on_cpu = str(args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cpu")
    notes = []
    if on_cpu and malloc_thresholds_move():
        pinned = " ".join(f"{key}={value}" for key, value in PINNED_MALLOC.items())
        notes.append(
            "batchfit: note: glibc's malloc moves its thresholds as the process runs, so on the CPU "
            "a batch size's throughput depends on which sizes ran before it; for steady figures (and "
            f"often faster training: the cnn example ran 15% faster) run with {pinned}, in training too."
        )

    def live(recommendation: Recommendation) -> None:
        while notes:  # once the measuring has begun: bad input gets its error alone
            print(notes.pop(), file=sys.stderr)
        print(f"batchfit: {recommendation.line()}", file=sys.stderr, flush=True)

    result = explore(
        _workload(args),
        device=args.device,
        memory_limit=args.memory_limit,
        fraction=args.fraction,
        min_batch=args.min_batch,
        max_batch=args.max_batch,
        tolerance=args.tolerance,
        objective=args.objective,
        base_batch=args.base_batch,
        world_size=args.devices,
        global_batch=args.global_batch,
        multiple_of=args.multiple_of,
        windows=args.windows,
        steps_per_window=args.steps_per_window,
        time_budget=args.time_budget,
        confidence_target=args.confidence,
        on_update=live,
    )
    print(f"batchfit: stopped ({result.stop_reason}) after {result.explore_seconds:.1f} s.", file=sys.stderr)
    text = {"text": result.table, "json": result.to_json, "csv": result.to_csv}[args.format]()
    _emit(text, args.output)
    return 0


def _analyze(args: argparse.Namespace) -> int:
    from batchfit.analyze import Bounds, analyze
    from batchfit.autobatch import workload_from_config
    from batchfit.config import load_config

    cfg = load_config(args.cfg, args.overrides)
    fractions = _parse_fractions(args.fractions)
    modes = _parse_modes(args.modes)
    if args.output is not None and args.output.suffix.lower() not in (".json", ".jsonl", ".csv"):
        raise ConfigurationError(f"--output {str(args.output)!r} must end in .json, .jsonl or .csv.")
    auto = cfg.DATA.AUTOBATCH
    bounds: dict[Mode, Bounds] = {
        "train": Bounds(auto.MIN_BATCH_SIZE, auto.MAX_BATCH_SIZE, auto.STEPS_PER_TRIAL),
        "eval": Bounds(auto.MIN_BATCH_SIZE_VAL, auto.MAX_BATCH_SIZE_VAL, auto.STEPS_PER_TRIAL_VAL),
    }
    analysis = analyze(
        workload_from_config(cfg),
        fractions,
        modes,
        bounds=bounds,
        device=cfg.DEVICE,  # type: ignore[arg-type]
        memory_limit=cfg.MEMORY_LIMIT,
        on_trial=lambda fraction, mode, trial: _print_trial(f"{mode}@{fraction:g}", trial),
    )
    print(
        f"batchfit: {analysis.trials_run} real trials for {len(analysis.rows)} searches "
        f"({analysis.separate_trials} if run separately), {analysis.traces_run} fake-tensor traces "
        f"({analysis.separate_traces} if run separately).",
        file=sys.stderr,
    )
    suffix = args.output.suffix.lower() if args.output is not None else None
    _emit(analysis.render(suffix) if suffix else _analysis_table(analysis), args.output)
    return 0


def _plan(args: argparse.Namespace) -> int:
    from batchfit.plan import plan

    result = plan(
        args.global_batch,
        max_micro_batch_size=args.max_micro_batch,
        micro_batch_size=args.micro_batch,
        world_size=args.devices,
        base_learning_rate=args.base_lr,
        base_batch_size=args.base_batch,
        scaling_rule=args.rule,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        scale_weight_decay=args.scale_weight_decay,
        uses_batchnorm=args.batchnorm,
        uses_ema=args.ema,
        fine_tuning=args.fine_tuning,
        steps_per_epoch=args.steps_per_epoch,
    )
    sys.stdout.write((result.to_json() if args.format == "json" else result.summary()) + "\n")
    return 0


def _analysis_table(analysis: Any) -> str:
    header = ("fraction", "mode", "batch_size", "peak", "limit", "trials", "seconds")
    lines = ["{:>8}  {:<5}  {:>10}  {:>11}  {:>11}  {:>6}  {:>7}".format(*header)]
    for row in analysis.rows:
        lines.append(
            f"{row.fraction:>8g}  {row.mode:<5}  {row.batch_size:>10}  {format_bytes(row.peak_bytes):>11}  "
            f"{format_bytes(row.limit_bytes):>11}  {row.trials:>6}  {row.seconds:>7.2f}"
        )
    return "\n".join(lines) + "\n"


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


def _parse_modes(text: str) -> list[Mode]:
    modes = [mode.strip() for mode in text.split(",") if mode.strip()]
    aliases = {"train": "train", "eval": "eval", "val": "eval"}
    unknown = [mode for mode in modes if mode not in aliases]
    if unknown or not modes:
        raise ConfigurationError(f"--modes {text!r}: use a comma-separated list of train and eval (or val).")
    return [aliases[mode] for mode in dict.fromkeys(modes)]  # type: ignore[misc]


def _show_candidate(mode: str, batch_size: int) -> None:
    """On a terminal, say which batch is running now; the trial's line overwrites it."""
    if sys.stderr.isatty():
        print(
            f"batchfit: {mode:<5} batch_size={batch_size:<6} running...",
            end="\r",
            file=sys.stderr,
            flush=True,
        )


def _print_trial(mode: str, trial: Trial) -> None:
    peak = format_bytes(trial.peak_bytes) if trial.peak_bytes else "-"  # 0: failed before a step
    extras = []
    if trial.step_seconds is not None:
        extras.append(f"{trial.step_seconds * 1000:8.1f} ms/step")
    if trial.reserved_peak_bytes is not None:
        extras.append(f"reserved {format_bytes(trial.reserved_peak_bytes)}")
    if trial.allocator_retries:
        extras.append(f"{trial.allocator_retries} allocator retries")
    clear = "\x1b[2K" if sys.stderr.isatty() else ""
    print(
        f"{clear}batchfit: {mode:<5} batch_size={trial.batch_size:<6} {trial.outcome:<11} "
        f"peak {peak:>11}{''.join('  ' + extra for extra in extras)}",
        file=sys.stderr,
        flush=True,
    )


def _render(workload: Workload, results: list[SearchResult], output_format: str) -> str:
    if output_format == "json":
        document: dict[str, Any] = {
            "workload": workload.name,
            "batchfit_version": batchfit.__version__,
            "torch_version": torch.__version__,
            "results": [result.to_dict() for result in results],
        }
        return json.dumps(document, indent=2) + "\n"
    lines = []
    for result in results:
        lines.append(f"{result.mode}_batch_size: {result.batch_size}")
    lines.append("")
    for result in results:
        lines.append(result.summary())
    return "\n".join(lines) + "\n"
