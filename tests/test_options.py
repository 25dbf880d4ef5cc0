"""The options the verbs share: validated when made, with errors that name the field; the verbs'
own parameters for them cannot drift from their fields; the flags are generated from them."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

import batchfit
from batchfit import BatchSizes, ConfigurationError, Goal, Timing, Trials, Where
from batchfit.cli import flags
from batchfit.options import mode_named


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Where(memory_fraction=0), "memory_fraction=0 must be in (0, 1]"),
        (lambda: Where(device="meta"), "device='meta' is not supported"),
        (lambda: Where(device="nonsense:x"), "device='nonsense:x' is not a device"),
        (lambda: Where(memory_limit="lots"), "memory_limit"),
        (lambda: BatchSizes(min_batch_size=0), "min_batch_size must be a positive integer, got 0."),
        (lambda: BatchSizes(min_batch_size=9, max_batch_size=8), "min_batch_size (9) is larger than"),
        (lambda: BatchSizes(min_batch_size=5, max_batch_size=7, multiple_of=8), "no multiple of 8 lies in"),
        (
            lambda: BatchSizes(global_batch_size=10, world_size=4),
            "global_batch_size (10) is not divisible by world_size (4); 8 or 12 would work.",
        ),
        (lambda: Trials(steps_per_trial=0), "steps_per_trial must be a positive integer, got 0."),
        (lambda: Trials(confirm_steps=-1), "confirm_steps must be a positive integer, got -1."),
        (lambda: Timing(windows=0), "windows must be a positive integer, got 0."),
        (lambda: Timing(time_budget_seconds=-1), "time_budget_seconds must be a non-negative number"),
        (lambda: Goal(tolerance=1.5), "tolerance=1.5 must be in [0, 1)"),
        (lambda: Goal(confidence_target=101), "confidence_target=101 must be in [0, 100]"),
    ],
)
def test_an_option_is_checked_when_it_is_made(make: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=None) as raised:
        make()  # type: ignore[operator]
    assert message in str(raised.value)


def test_where_parses_once_and_keeps_cuda_without_an_index() -> None:
    where = Where("cuda", "2GiB", 0.5)
    assert where.torch_device is not None and where.torch_device.type == "cuda"
    assert where.torch_device.index is None  # each rank's own under torchrun
    assert where.memory_limit_bytes == 2 * 1024**3
    assert Where().torch_device is None and Where("cpu").on_cpu
    assert where.keywords() == {"device": "cuda", "memory_limit": "2GiB", "memory_fraction": 0.5}


def test_eval_takes_twice_the_training_range_only_when_one_range_serves_both() -> None:
    assert BatchSizes().upper("train") == 512 and BatchSizes().upper("eval") == 1024
    assert BatchSizes(max_batch_size=300).upper("eval") == 300
    assert BatchSizes(max_batch_size=300).for_mode("eval").upper("eval") == 600
    assert BatchSizes(max_batch_size=300).for_mode("train") == BatchSizes(max_batch_size=300)


def test_find_takes_no_global_batch() -> None:
    with pytest.raises(ConfigurationError, match="find searches the whole range"):
        BatchSizes(global_batch_size=64).candidates("train")


@pytest.mark.parametrize(("given", "mode"), [("train", "train"), ("eval", "eval"), ("val", "eval")])
def test_val_is_eval(given: str, mode: str) -> None:
    assert mode_named(given) == mode


def test_a_mode_that_is_none_is_named_in_the_error() -> None:
    with pytest.raises(
        ConfigurationError, match="mode='test' is not a mode: use 'train' or 'eval' \\(or 'val'\\)"
    ):
        mode_named("test")


@pytest.mark.parametrize(
    "verb", [batchfit.find_batch_size, batchfit.explore, batchfit.compare, batchfit.advise]
)
def test_where_a_verb_is_measured_is_where_s_own_fields_and_defaults(verb: object) -> None:
    parameters = inspect.signature(verb).parameters  # type: ignore[arg-type]
    for field in dataclasses.fields(Where):
        if field.init:
            assert parameters[field.name].default == field.default, (verb, field.name)
            assert parameters[field.name].kind is inspect.Parameter.KEYWORD_ONLY


def test_flags_are_the_fields_with_dashes_and_their_help() -> None:
    parser = argparse.ArgumentParser()
    flags.add_options(parser, Timing(time_budget_seconds=10.0), help={"windows": "rounds"})
    actions = {action.dest: action for action in parser._actions if action.dest != "help"}
    assert set(actions) == {"windows", "steps_per_window", "time_budget_seconds"}  # tokens: no flag
    assert actions["time_budget_seconds"].option_strings == ["--time-budget-seconds"]
    assert actions["time_budget_seconds"].default == 10.0  # the instance's, not the field's
    assert actions["windows"].help == "rounds (default: %(default)s)"
    assert (
        actions["steps_per_window"].help == Timing.__dataclass_fields__["steps_per_window"].metadata["help"]
    )
    parsed = parser.parse_args(["--windows", "5", "--time-budget-seconds", "2.5"])
    assert flags.options(parsed, Timing) == Timing(windows=5, time_budget_seconds=2.5)


def test_a_literal_field_is_a_flag_with_choices_and_a_bool_a_switch() -> None:
    parser = argparse.ArgumentParser()
    flags.add_options(parser, Goal)
    flags.add_options(parser, batchfit.LoaderSetting)
    parsed = parser.parse_args(["--objective", "max-throughput", "--pin-memory"])
    assert flags.options(parsed, Goal).objective == "max-throughput"
    assert flags.options(parsed, batchfit.LoaderSetting).pin_memory is True
    with pytest.raises(SystemExit):
        parser.parse_args(["--objective", "fastest"])
