"""The options the verbs share: validated when made, with errors that name the field; the verbs'
own parameters for them cannot drift from their fields; the flags are generated from them."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import typing

import pytest
import torch
from tiny_workloads import build

import batchfit
from batchfit import BatchSizes, ConfigurationError, Goal, Timing, Trials, Where
from batchfit.advice.advise import Checklist
from batchfit.checks import check_device
from batchfit.cli import flags
from batchfit.errors import ArgumentTypeError
from batchfit.options import mode_named
from batchfit.policy.explore.loader_settings import LoaderSetting
from batchfit.where import where_of


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
    assert where.device == "cuda"  # no index: each rank's own under torchrun
    assert check_device(torch.device("cuda")) == "cuda" and check_device("cuda:1") == "cuda:1"
    assert where.memory_limit_bytes == 2 * 1024**3
    assert Where().device is None and Where("cpu").device == "cpu"
    loose = {"device": "cuda", "memory_limit": "2GiB", "memory_fraction": 0.5}
    assert where_of("find_batch_size", None, loose) == where  # the loose keywords' Where


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


#: Each public verb, and the loose keywords it keeps as the one-line call's shorthand for ``where``.
LOOSE = {
    batchfit.find_batch_size: ("device", "memory_limit", "memory_fraction"),
    batchfit.explore: ("device", "memory_limit", "memory_fraction"),
    batchfit.compare: ("device", "memory_limit", "memory_fraction"),
    batchfit.advise: ("device", "memory_limit", "memory_fraction"),
    batchfit.check: ("device", "memory_limit", "memory_fraction"),
    batchfit.noise_scale: ("device", "memory_limit", "memory_fraction"),
    batchfit.predict: ("device", "memory_limit", "memory_fraction"),
    batchfit.analyze: ("device", "memory_limit"),  # its memory_fractions are swept
    batchfit.check_data: ("device",),  # a data loader needs no capacity
}


@pytest.mark.parametrize("verb", list(LOOSE))
def test_every_verb_takes_a_where_and_keeps_where_s_fields_as_its_shorthand(verb: object) -> None:
    parameters = inspect.signature(verb).parameters  # type: ignore[arg-type]
    fields = {field.name for field in dataclasses.fields(Where) if field.init}
    assert parameters["where"].default is None
    assert parameters["where"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "on_progress" in parameters
    assert not fields & set(parameters)  # no loose keyword of its own: the shorthand holds them
    assert parameters["shorthand"].kind is inspect.Parameter.VAR_KEYWORD
    (shorthand,) = typing.get_args(typing.get_type_hints(verb)["shorthand"])  # Unpack[...]'s TypedDict
    assert set(LOOSE[verb]) <= fields and shorthand.__optional_keys__ == set(LOOSE[verb])  # type: ignore[index]
    assert not shorthand.__required_keys__  # each optional: absent (or None) is where's own default
    assert where_of("verb", None, {}) == Where()  # nothing given: where's defaults
    assert where_of("verb", None, dict.fromkeys(LOOSE[verb])) == Where()  # type: ignore[index]


def test_flags_are_the_fields_with_dashes_and_their_help() -> None:
    parser = argparse.ArgumentParser()
    flags.add_options(parser, Timing(time_budget_seconds=10.0), help={"windows": "rounds"})
    actions = {action.dest: action for action in parser._actions if action.dest != "help"}
    # tokens_per_sample: no flag
    assert set(actions) == {"windows", "steps_per_window", "time_budget_seconds", "time_slow"}
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
    flags.add_options(parser, LoaderSetting)
    parsed = parser.parse_args(["--objective", "max-throughput", "--pin-memory"])
    assert flags.options(parsed, Goal).objective == "max-throughput"
    assert flags.options(parsed, LoaderSetting).pin_memory is True
    with pytest.raises(SystemExit):
        parser.parse_args(["--objective", "fastest"])


# -- every public entry checks its arguments' types as it is called, and says what to pass ---------

WRAP = "wrap it: batchfit.Workload(model, optimizer, make_batch=..., loss_fn=...)."
TARGETS = batchfit.Targets(capacities="24GiB")
#: Each verb called with ``workload`` and its required arguments, every other one as given.
VERBS = {
    "find_batch_size": lambda workload, **given: batchfit.find_batch_size(workload, **given),
    "explore": lambda workload, **given: batchfit.explore(workload, **given),
    "compare": lambda workload, **given: batchfit.compare(workload, **given),
    "check_data": lambda workload, **given: batchfit.check_data(workload, 8, **given),
    "advise": lambda workload, **given: batchfit.advise(workload, **given),
    "analyze": lambda workload, **given: batchfit.analyze(workload, [0.8], **given),
    "noise_scale": lambda workload, **given: batchfit.noise_scale(
        workload, **{"sampling": batchfit.Sampling(batch_size=8, micro_batch_size=4), **given}
    ),
    "predict": lambda workload, **given: batchfit.predict(workload, **{"targets": TARGETS, **given}),
    "check": lambda workload, **given: batchfit.check(workload, 8, **given),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_keyword_a_verb_does_not_take_is_a_type_error_naming_it(verb: str) -> None:
    with pytest.raises(ArgumentTypeError) as raised:
        VERBS[verb](build("mlp"), where=Where("cpu"), memory_limt="2GiB")
    (accepted,) = [names for function, names in LOOSE.items() if function.__name__ == verb]  # type: ignore[attr-defined]
    hint = " (did you mean memory_limit=?)" if "memory_limit" in accepted else ""
    assert str(raised.value) == (
        f"{verb}() got an unexpected keyword argument 'memory_limt'{hint}: besides its own "
        f"parameters (help(batchfit.{verb})) it takes {', '.join(f'{name}=' for name in accepted)} "
        "as shorthand for where=batchfit.Where(...)."
    )


def _sequential() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 2))


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_given_a_model_says_to_wrap_it_in_a_workload(verb: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        VERBS[verb](_sequential(), device="cpu")
    assert str(raised.value) == f"{verb} expects a batchfit.Workload, got torch.nn.Sequential; {WRAP}"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            "my_train:workload",
            "got str ('my_train:workload'); load it: batchfit.load_workload('my_train:workload').",
        ),
        (
            {"model": 1},
            (
                "got dict; build one: batchfit.Workload(model, optimizer, make_batch=..., loss_fn=...), "
                "or load "
                "one: batchfit.load_workload('my_train:workload')."
            ),
        ),
    ],
)
def test_a_spec_or_anything_else_is_not_a_workload_either(given: object, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        batchfit.find_batch_size(given, device="cpu")  # type: ignore[arg-type]
    assert str(raised.value) == f"find_batch_size expects a batchfit.Workload, {message}"


@pytest.mark.parametrize(
    ("verb", "name", "value", "kind", "got"),
    [
        (
            "find_batch_size",
            "sizes",
            64,
            "BatchSizes",
            "int (64); pass sizes=batchfit.BatchSizes(max_batch_size=64)",
        ),
        ("find_batch_size", "trials", 2, "Trials", "int (2); pass trials=batchfit.Trials(steps_per_trial=2)"),
        ("explore", "sizes", 64, "BatchSizes", "int (64); pass sizes=batchfit.BatchSizes(max_batch_size=64)"),
        ("explore", "timing", 3, "Timing", "int (3); pass timing=batchfit.Timing(...)"),
        ("explore", "goal", 0.03, "Goal", "float (0.03); pass goal=batchfit.Goal(...)"),
        (
            "compare",
            "timing",
            {"windows": 3},
            "Timing",
            "dict ({'windows': 3}); pass timing=batchfit.Timing(...)",
        ),
        (
            "check_data",
            "search",
            8,
            "LoaderSearch",
            (
                "int (8); pass search=LoaderSearch(...) "
                "(from batchfit.policy.explore.loader_settings import LoaderSearch)"
            ),
        ),
        (
            "advise",
            "checklist",
            ("find",),
            "Checklist",
            "tuple (('find',)); pass checklist=Checklist(...) (from batchfit.advice.advise import Checklist)",
        ),
        ("advise", "baseline", 0.1, "Baseline", "float (0.1); pass baseline=batchfit.Baseline(...)"),
        ("noise_scale", "sampling", 64, "Sampling", "int (64); pass sampling=batchfit.Sampling(...)"),
        ("predict", "targets", "24GiB", "Targets", "str ('24GiB'); pass targets=batchfit.Targets(...)"),
        (
            "predict",
            "trials",
            batchfit.Timing(),
            "Trials",
            (
                "batchfit.Timing (Timing(windows=3, steps_per_window=None, time_budget_seco...); "
                "pass trials=batchfit.Trials(...)"
            ),
        ),
        ("check", "trials", "2", "Trials", "str ('2'); pass trials=batchfit.Trials(...)"),
    ],
)
def test_an_options_object_of_the_wrong_type_is_named_with_what_to_pass(
    verb: str, name: str, value: object, kind: str, got: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        VERBS[verb](build("mlp"), device="cpu", **{name: value})
    written = f"batchfit.{kind}" if kind in batchfit.__all__ else kind  # one from its module: by name
    assert str(raised.value) == f"{verb}'s {name} must be a {written}, got {got}."


def test_analyze_takes_its_options_per_mode_and_plan_its_baseline_typed() -> None:
    with pytest.raises(ConfigurationError) as raised:
        batchfit.analyze(build("mlp"), [0.8], sizes_by_mode=BatchSizes(), device="cpu")  # type: ignore[arg-type]
    assert str(raised.value) == (
        "analyze's sizes_by_mode must be a mapping of mode to batchfit.BatchSizes (or None), got "
        "batchfit.BatchSizes; "
        "pass sizes_by_mode={'train': batchfit.BatchSizes(...)}."
    )
    with pytest.raises(ConfigurationError) as raised:
        batchfit.plan(1024, 0.1)  # type: ignore[arg-type]
    assert str(raised.value) == (
        "plan's baseline must be a batchfit.Baseline, got float (0.1); pass baseline=batchfit.Baseline(...)."
    )


def test_on_progress_that_is_not_a_function_is_refused_before_any_trial() -> None:
    with pytest.raises(ConfigurationError) as raised:
        batchfit.find_batch_size(build("mlp"), device="cpu", on_progress="verbose")  # type: ignore[arg-type]
    assert str(raised.value) == (
        "find_batch_size's on_progress must be a function taking a batchfit.Event, or None; got str "
        "('verbose')."
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: Trials(eval_with_training_state="no"),
            "eval_with_training_state must be True or False, got str ('no').",
        ),
        (
            lambda: batchfit.Sampling(batch_size=64, micro_batch_size=16, fixed_weights="yes"),
            "fixed_weights must be True or False, got str ('yes').",
        ),
        (lambda: Goal(tolerance="0.1"), "tolerance must be a number, got str ('0.1')."),
        (lambda: Goal(confidence_target="90"), "confidence_target must be a number, got str ('90')."),
        (
            lambda: Where(memory_fraction="0.8"),
            "memory_fraction='0.8' must be a number in (0, 1]: the share of device memory a batch may use.",
        ),
        (lambda: BatchSizes(max_batch_size="64"), "max_batch_size must be a positive integer, got '64'."),
        (lambda: Trials(steps_per_trial=2.0), "steps_per_trial must be a positive integer, got 2.0."),
        (
            lambda: LoaderSetting(num_workers=2, pin_memory="no").check(),
            "pin_memory must be True or False, got str ('no').",
        ),
        (
            lambda: Checklist(skip="compare"),
            "Checklist.skip must be a tuple of names, got str ('compare'); pass skip=('compare',).",
        ),
        (
            lambda: Checklist(techniques="amp"),
            (
                "Checklist.techniques must be a tuple of names, got str ('amp'); pass techniques=('amp', "
                "'checkpointing')."
            ),
        ),
    ],
)
def test_an_option_of_the_wrong_type_says_what_it_takes(make: object, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        make()  # type: ignore[operator]
    assert str(raised.value) == message


def _batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 4), torch.randint(0, 2, (n,))


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"model": torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)},
            "Workload.model must be a torch.nn.Module, got torch.optim.SGD.",
        ),
        (
            {"optimizer": 0.1},
            (
                "Workload.optimizer must be a torch.optim.Optimizer or a factory params -> Optimizer "
                "(e.g. lambda "
                "params: torch.optim.AdamW(params, lr=1e-3)), got float (0.1)."
            ),
        ),
        (
            {"make_batch": 64},
            (
                "Workload.make_batch must be a function taking a batch size n and returning n samples, "
                "or None; "
                "got int (64)."
            ),
        ),
        (
            {"loss_fn": "cross_entropy"},
            (
                "Workload.loss_fn must be a function taking (output, target), or None; got str "
                "('cross_entropy')."
            ),
        ),
        (
            {"train_step": 1},
            "Workload.train_step must be a function taking (model, optimizer, batch), or None; got int (1).",
        ),
        (
            {"batch_dim": "0"},
            (
                "Workload.batch_dim must be an int (the dimension of a batch's tensors that holds its "
                "samples), "
                "got str ('0')."
            ),
        ),
        ({"tokens_per_sample": 0}, "Workload.tokens_per_sample must be a positive integer, got 0."),
        ({"name": 7}, "Workload.name must be a str, got int."),
    ],
)
def test_a_workload_checks_its_fields_when_it_is_made(given: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {
        "model": _sequential(),
        "optimizer": lambda params: torch.optim.SGD(params, lr=0.1),
        "make_batch": _batch,
        "loss_fn": torch.nn.functional.cross_entropy,
    }
    with pytest.raises(ConfigurationError) as raised:
        batchfit.Workload(**{**fields, **given})  # type: ignore[arg-type]
    assert str(raised.value) == message


def test_load_workload_takes_a_spec_and_says_to_call_a_function_yourself() -> None:
    with pytest.raises(ConfigurationError) as raised:
        batchfit.load_workload(_sequential)  # type: ignore[arg-type]
    assert str(raised.value) == (
        "load_workload expects a spec 'module:function' or 'example:NAME' (a str), got function; call it "
        "yourself (workload = _sequential()), or pass a spec such as load_workload('my_train:workload')."
    )
    with pytest.raises(ConfigurationError) as raised:
        batchfit.load_workload(3)  # type: ignore[arg-type]
    assert str(raised.value) == (
        "load_workload expects a spec 'module:function' or 'example:NAME' (a str), got int; pass a spec "
        "such as load_workload('my_train:workload')."
    )


# -- the meta device's advice leads to what works: predict, from the shapes alone ------------------


def _on_meta(device: str) -> batchfit.Workload:
    with torch.device(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    return batchfit.Workload(
        model,
        lambda params: torch.optim.AdamW(params, lr=1e-3),
        make_batch=lambda n: (torch.randn(n, 64), torch.randint(0, 10, (n,))),
        loss_fn=torch.nn.functional.cross_entropy,
    )


def test_a_model_on_the_meta_device_is_sent_to_predict_and_predict_answers_as_for_the_real_model() -> None:
    workload = _on_meta("meta")
    advice = (
        "batchfit.predict(workload, batchfit.Targets(capacities='24GiB'), device='cpu') (batchfit predict "
        "--device cpu --capacities 24GiB)"
    )
    with pytest.raises(ConfigurationError) as raised:
        batchfit.find_batch_size(workload, device="cpu", memory_limit="64MiB")
    assert str(raised.value) == (
        "the model's 0.weight is on the meta device, which holds shapes but no memory, so no step runs on "
        f"cpu; predict its batch sizes from the shapes alone with {advice}, or build the model on cpu to "
        "measure it there."
    )
    with pytest.raises(ConfigurationError) as raised:
        batchfit.find_batch_size(workload, device="meta")
    assert str(raised.value) == (
        "device='meta' is not supported: batchfit measures 'cpu' and 'cuda' devices; a model built on the "
        f"meta device is predicted from its shapes with {advice}."
    )
    # The advice, followed: the same answers as for the model built on the CPU.
    followed = batchfit.predict(workload, batchfit.Targets(capacities="24GiB"), device="cpu")
    real = batchfit.predict(_on_meta("cpu"), batchfit.Targets(capacities="24GiB"), device="cpu")
    assert followed.cpu_alone and followed.rows == real.rows
    assert followed.rows[0].train is not None and followed.rows[0].train.batch_size >= 1


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_loose_keyword_that_disagrees_with_where_is_an_error_naming_both(verb: str) -> None:
    where = Where("cpu", "64MiB", 0.5)
    with pytest.raises(ConfigurationError) as raised:
        VERBS[verb](build("mlp"), where=where, device="cuda")
    assert str(raised.value) == (
        f"{verb} was given where=Where(device='cpu', memory_limit='64MiB', memory_fraction=0.5) and "
        "device='cuda', which disagree (where.device is 'cpu'): pass one of them, "
        "where=Where(..., device='cuda') or the keyword alone."
    )


def test_a_loose_keyword_that_says_what_where_says_is_where() -> None:
    where = Where("cpu", "64MiB", 0.5)
    same = {"device": "cpu", "memory_limit": 64 * 2**20, "memory_fraction": 0.5}
    assert where_of("find_batch_size", where, same) is where
    with pytest.raises(ConfigurationError, match=r"memory_fraction=0.8, which disagree"):
        where_of("find_batch_size", where, {"memory_fraction": 0.8})
    with pytest.raises(ConfigurationError, match=r"find_batch_size's where must be a batchfit.Where"):
        where_of("find_batch_size", "cpu", {})  # type: ignore[arg-type]


def test_a_search_given_where_answers_as_one_given_its_loose_keywords() -> None:
    loose = batchfit.find_batch_size(build("mlp"), device="cpu", memory_limit="3MiB", memory_fraction=0.9)
    where = batchfit.find_batch_size(build("mlp"), where=Where("cpu", "3MiB", 0.9))
    assert where.batch_size == loose.batch_size and where.budget_bytes == loose.budget_bytes
    assert where.batch_size < 512  # the capacity was applied


def test_noise_scale_given_where_s_capacity_is_capped_as_one_given_the_keyword() -> None:
    sampling = batchfit.Sampling(batch_size=8, micro_batch_size=4, steps=2)
    for given in ({"device": "cpu", "memory_limit": "64KiB"}, {"where": Where("cpu", "64KiB")}):
        with pytest.raises(
            batchfit.DoesNotFitError, match="out of memory reading the noise scale at micro_batch_size=4"
        ):
            batchfit.noise_scale(build("mlp"), sampling=sampling, **given)  # type: ignore[arg-type]
