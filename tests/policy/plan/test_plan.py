"""batchfit.plan and ``batchfit plan``: the split of a global batch, the scaled learning rate, warnings."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import math
import re
import subprocess
import sys
from dataclasses import FrozenInstanceError, fields
from pathlib import Path
from typing import Any

import pytest

import batchfit
from batchfit.cli import main, parser
from batchfit.errors import ConfigurationError
from batchfit.policy.plan.plan import Plan, plan
from batchfit.policy.plan.plan_options import Baseline, Scaling, TrainingFacts
from batchfit.policy.plan.scaling_rules import family

HINT = "(set BATCHFIT_DEBUG=1 to see the traceback)"
BASE: dict[str, Any] = {"base_learning_rate": 0.1, "base_batch_size": 256}


def make(global_batch_size: int = 1024, **overrides: Any) -> Plan:
    """``plan`` with the tables' flat overrides sorted into the option objects that own them."""
    arguments: dict[str, Any] = {"max_micro_batch_size": 48, "world_size": 8, **BASE}
    arguments.update(overrides)

    def take(options: type[Any]) -> Any:
        return options(
            **{field.name: arguments.pop(field.name) for field in fields(options) if field.name in arguments}
        )

    baseline, scaling, training = take(Baseline), take(Scaling), take(TrainingFacts)
    return plan(global_batch_size, baseline, scaling=scaling, training=training, **arguments)


def error_of(global_batch_size: int, **overrides: Any) -> str:
    with pytest.raises(ConfigurationError) as caught:
        make(global_batch_size, **overrides)
    return str(caught.value)


# The split ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("global_batch_size", "world_size", "max_micro", "micro", "accumulation"),
    [
        (1024, 8, 48, 32, 4),  # 128 per device: 32 divides it, 48 does not
        (1000, 8, 48, 25, 5),  # 125 per device: 25 is the largest divisor up to 48
        (256, 8, 48, 32, 1),  # the per-device batch fits whole
        (96, 1, 48, 48, 2),
        (1024, 1, 48, 32, 32),
        (8192, 8, 64, 64, 16),
        (1, 1, 1, 1, 1),
    ],
)
def test_split_uses_the_largest_micro_batch_that_divides(
    global_batch_size: int, world_size: int, max_micro: int, micro: int, accumulation: int
) -> None:
    result = make(global_batch_size, world_size=world_size, max_micro_batch_size=max_micro)
    assert (result.micro_batch_size, result.accumulation_steps) == (micro, accumulation)
    assert result.global_batch_size == micro * accumulation * world_size == global_batch_size


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
@pytest.mark.parametrize("max_micro", [1, 5, 12, 48])
def test_split_has_the_fewest_accumulation_steps_against_brute_force(world_size: int, max_micro: int) -> None:
    for global_batch_size in range(1, 400):
        per_device, remainder = divmod(global_batch_size, world_size)
        best = max(micro for micro in range(1, max_micro + 1) if per_device % micro == 0)
        # refused exactly when indivisible, or when the best micro-batch is under half of what could run
        acceptable = remainder == 0 and 2 * best >= min(per_device, max_micro)
        try:
            result = make(global_batch_size, world_size=world_size, max_micro_batch_size=max_micro)
        except ConfigurationError:
            assert not acceptable, global_batch_size
            continue
        assert acceptable, global_batch_size
        assert (result.micro_batch_size, result.accumulation_steps) == (best, per_device // best)


def test_forced_micro_batch_is_used_as_given() -> None:
    result = make(1000, micro_batch_size=25)
    assert (result.micro_batch_size, result.accumulation_steps) == (25, 5)
    result = make(1024, micro_batch_size=8, max_micro_batch_size=None)
    assert (result.micro_batch_size, result.accumulation_steps) == (8, 16)


@pytest.mark.parametrize(
    ("global_batch_size", "world_size", "micro", "message"),
    [
        (
            1000,
            8,
            48,
            (
                "global_batch_size (1000) is not divisible by world_size x micro_batch_size (8 x 48 = 384); "
                "768 or 1152 would work."
            ),
        ),
        (
            100,
            8,
            48,
            (
                "global_batch_size (100) is not divisible by world_size x micro_batch_size (8 x 48 = 384); "
                "384 would work."
            ),
        ),
        (
            1000,
            3,
            16,
            (
                "global_batch_size (1000) is not divisible by world_size x micro_batch_size (3 x 16 = 48); "
                "960 or 1008 would work."
            ),
        ),
    ],
)
def test_forced_micro_batch_that_does_not_divide_names_sizes_that_work(
    global_batch_size: int, world_size: int, micro: int, message: str
) -> None:
    assert error_of(global_batch_size, world_size=world_size, micro_batch_size=micro) == message


@pytest.mark.parametrize(
    ("global_batch_size", "world_size", "message"),
    [
        (1000, 3, "global_batch_size (1000) is not divisible by world_size (3); 999 or 1008 would work."),
        (7, 8, "global_batch_size (7) is not divisible by world_size (8); 8 would work."),
        (
            1016,
            8,
            (
                "global_batch_size (1016) is 127 samples per device on world_size 8, and the largest "
                "micro_batch_size up to max_micro_batch_size (48) that divides 127 is 1 (127 "
                "accumulation_steps), under half of 48; 1008 or 1024 would work, or pass micro_batch_size "
                "to force one."
            ),
        ),
        (
            49,
            1,
            (
                "global_batch_size (49) is 49 samples per device on world_size 1, and the largest "
                "micro_batch_size up to max_micro_batch_size (48) that divides 49 is 7 (7 "
                "accumulation_steps), under half of 48; 48 or 50 would work, or pass micro_batch_size to "
                "force one."
            ),
        ),
    ],
)
def test_refused_global_batch_names_the_nearest_that_work(
    global_batch_size: int, world_size: int, message: str
) -> None:
    assert error_of(global_batch_size, world_size=world_size) == message


@pytest.mark.parametrize(("global_batch_size", "world_size"), [(1000, 3), (1016, 8), (49, 1), (4099, 4)])
def test_suggested_sizes_work_and_none_between_does(global_batch_size: int, world_size: int) -> None:
    message = error_of(global_batch_size, world_size=world_size)
    below, above = (int(size) for size in re.findall(r"; (\d+) or (\d+) would work", message)[0])
    make(below, world_size=world_size)
    make(above, world_size=world_size)
    for size in range(below + 1, above):
        with pytest.raises(ConfigurationError):
            make(size, world_size=world_size)


# Learning rate, warm-up, weight decay -------------------------------------------------------------


@pytest.mark.parametrize(
    ("global_batch_size", "base_lr", "base_batch_size", "rule", "learning_rate"),
    [
        (1024, 0.1, 256, "linear", 0.4),  # Goyal et al.: ResNet-50 0.1 at 256
        (128, 0.1, 256, "linear", 0.05),
        (256, 0.1, 256, "linear", 0.1),
        (1024, 0.1, 256, "sqrt", 0.2),
        (256, 0.001, 64, "sqrt", 0.002),
        (64, 0.1, 256, "sqrt", 0.05),
    ],
)
def test_learning_rate_follows_the_rule(
    global_batch_size: int, base_lr: float, base_batch_size: int, rule: str, learning_rate: float
) -> None:
    result = make(
        global_batch_size,
        world_size=1,
        max_micro_batch_size=global_batch_size,
        base_learning_rate=base_lr,
        base_batch_size=base_batch_size,
        scaling_rule=rule,
    )
    assert result.learning_rate == learning_rate
    assert result.scale_factor == global_batch_size / base_batch_size
    assert result.scaling_rule == rule


@pytest.mark.parametrize(
    ("global_batch_size", "rule", "steps_per_epoch", "warmup_steps"),
    [
        (256, "linear", None, 0),  # no scale-up
        (128, "linear", None, 0),  # a scale-down needs none
        (512, "linear", None, 200),
        (1024, "linear", None, 400),
        (2560, "linear", None, 1000),  # seed 002: 1000 steps for 10x
        (8192, "linear", None, 3200),
        (8192, "linear", 156, 780),  # Goyal et al.: 5 epochs of 156 steps at 8192
        (8192, "linear", 10_000, 3200),  # the cap does not bind
        (1024, "sqrt", None, 200),  # the learning rate rises 2x, not 4x
        (512, "sqrt", None, 142),  # ceil(100 x sqrt(2))
    ],
)
def test_recommended_warmup(
    global_batch_size: int, rule: str, steps_per_epoch: int | None, warmup_steps: int
) -> None:
    result = make(global_batch_size, world_size=1, scaling_rule=rule, steps_per_epoch=steps_per_epoch)
    assert result.warmup_steps == warmup_steps
    assert result.warmup_recommended


def test_given_warmup_is_kept() -> None:
    result = make(1024, warmup_steps=50)
    assert (result.warmup_steps, result.warmup_recommended) == (50, False)


@pytest.mark.parametrize(
    ("rule", "scale", "weight_decay"),
    [
        ("linear", False, 1e-4),
        ("linear", True, 2e-4),  # sqrt(1024 / 256) = 2
        ("sqrt", True, 2e-4),  # the same square root whatever the learning-rate rule
    ],
)
def test_weight_decay(rule: str, scale: bool, weight_decay: float) -> None:
    result = make(1024, scaling_rule=rule, weight_decay=1e-4, scale_weight_decay=scale)
    assert (result.weight_decay, result.base_weight_decay) == (weight_decay, 1e-4)
    assert make(1024).weight_decay is None


# Warnings -----------------------------------------------------------------------------------------

KINDS = {
    "accumulation_steps": "accumulation",
    "learning_rate": "warmup",
    "uses_batchnorm": "batchnorm",
    "uses_ema": "ema",
    "fine_tuning": "fine_tuning",
}


def kinds(result: Plan) -> set[str]:
    return {KINDS[warning.split(" ", 1)[0]] for warning in result.warnings}


@pytest.mark.parametrize(
    ("global_batch_size", "overrides", "expected"),
    [
        (1024, {}, set()),
        (544, {"world_size": 1, "max_micro_batch_size": 32}, {"accumulation"}),  # 17 steps
        (512, {"world_size": 1, "max_micro_batch_size": 32}, set()),  # 16 steps
        (1024, {"warmup_steps": 0}, {"warmup"}),  # 4x
        (512, {"warmup_steps": 0}, set()),  # 2x
        (1024, {"warmup_steps": 10}, set()),
        (1024, {"warmup_steps": 0, "scaling_rule": "sqrt"}, set()),  # 2x learning rate
        (4096, {"warmup_steps": 0, "scaling_rule": "sqrt"}, {"warmup"}),  # 4x learning rate
        (512, {"uses_batchnorm": True, "max_micro_batch_size": 8}, {"batchnorm"}),
        (512, {"uses_batchnorm": True, "max_micro_batch_size": 16}, set()),
        (512, {"max_micro_batch_size": 8}, set()),
        (1024, {"uses_ema": True}, {"ema"}),  # 4 accumulation steps
        (256, {"uses_ema": True}, set()),  # 1 accumulation step
        (1024, {"fine_tuning": True}, {"fine_tuning"}),
        (128, {"fine_tuning": True}, {"fine_tuning"}),  # over 64, though the learning rate drops
        (64, {"fine_tuning": True, "base_batch_size": 64}, set()),
        (32, {"fine_tuning": True, "base_batch_size": 16}, {"fine_tuning"}),  # learning rate doubles
        (
            8192,
            {"world_size": 1, "max_micro_batch_size": 64, "warmup_steps": 0, "uses_ema": True},
            {"accumulation", "warmup", "ema"},
        ),
    ],
)
def test_each_warning_appears_exactly_when_it_applies(
    global_batch_size: int, overrides: dict[str, Any], expected: set[str]
) -> None:
    assert kinds(make(global_batch_size, **overrides)) == expected


@pytest.mark.parametrize(
    ("global_batch_size", "overrides", "warning"),
    [
        (
            544,
            {"world_size": 1, "max_micro_batch_size": 32},
            (
                "accumulation_steps 17 is above 16: every optimizer step runs 17 forward and backward passes "
                "one after another; keep it at 16 or less with a larger micro-batch (if memory allows), more "
                "devices or a smaller global_batch_size."
            ),
        ),
        (
            8192,
            {"warmup_steps": 0, "steps_per_epoch": 156, "max_micro_batch_size": 64},
            (
                "learning_rate 3.2 is 32x base_learning_rate with warmup_steps 0: a jump this large can "
                "diverge in the first steps; warm up linearly over about 780 steps (leave warmup_steps "
                "unset for this recommendation)."
            ),
        ),
        (
            512,
            {"uses_batchnorm": True, "max_micro_batch_size": 8},
            (
                "uses_batchnorm with micro_batch_size 8: BatchNorm statistics see only the 8 samples of one "
                "forward pass, not the global batch, and under 16 they are noisy; convert the model with "
                "torch.nn.SyncBatchNorm.convert_sync_batchnorm (statistics over 8 x 8 = 64 samples) or use "
                "GroupNorm."
            ),
        ),
        (
            64,
            {"uses_batchnorm": True, "max_micro_batch_size": 8, "world_size": 1},
            (
                "uses_batchnorm with micro_batch_size 8: BatchNorm statistics see only the 8 samples of one "
                "forward pass, not the global batch, and under 16 they are noisy; use GroupNorm "
                "(SyncBatchNorm only pools across devices, and there is one)."
            ),
        ),
        (
            1024,
            {"uses_ema": True},
            (
                "uses_ema with accumulation_steps 4: update the EMA once per optimizer step (right after "
                "optimizer.step()), not after each of the 4 backward passes, or it decays 4 times per update."
            ),
        ),
        (
            1024,
            {"fine_tuning": True},
            (
                "fine_tuning with global_batch_size 1024 and learning_rate 0.4 (4x base_learning_rate): "
                "large batches and large steps overwrite pre-trained weights quickly; fine-tune with a "
                "global batch of 64 or less and a learning rate 10-100x below the pre-training one."
            ),
        ),
    ],
)
def test_warning_text(global_batch_size: int, overrides: dict[str, Any], warning: str) -> None:
    assert make(global_batch_size, **overrides).warnings == (warning,)


# Bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("global_batch_size", "overrides", "message"),
    [
        (0, {}, "global_batch_size must be a positive integer, got 0."),
        (1024.0, {}, "global_batch_size must be a positive integer, got 1024.0."),
        (1024, {"world_size": 0}, "world_size must be a positive integer, got 0."),
        (1024, {"world_size": True}, "world_size must be a positive integer, got True."),
        (1024, {"max_micro_batch_size": 0}, "max_micro_batch_size must be a positive integer, got 0."),
        (1024, {"micro_batch_size": -4}, "micro_batch_size must be a positive integer, got -4."),
        (1024, {"base_batch_size": 0}, "base_batch_size must be a positive integer, got 0."),
        (1024, {"base_learning_rate": 0.0}, "base_learning_rate must be a positive number, got 0.0."),
        (1024, {"base_learning_rate": -0.1}, "base_learning_rate must be a positive number, got -0.1."),
        (1024, {"base_learning_rate": math.nan}, "base_learning_rate must be a positive number, got nan."),
        (1024, {"base_learning_rate": math.inf}, "base_learning_rate must be a positive number, got inf."),
        (1024, {"scaling_rule": "cubic"}, "scaling_rule must be 'linear' or 'sqrt', got 'cubic'."),
        (1024, {"warmup_steps": -1}, "warmup_steps must be an integer >= 0, got -1."),
        (1024, {"steps_per_epoch": 0}, "steps_per_epoch must be a positive integer, got 0."),
        (1024, {"weight_decay": -1e-4}, "weight_decay must be a non-negative number, got -0.0001."),
        (
            1024,
            {"scale_weight_decay": True},
            "scale_weight_decay needs weight_decay (the value at base_batch_size).",
        ),
        (
            1024,
            {"max_micro_batch_size": None},
            "plan needs max_micro_batch_size (the largest micro-batch that fits) or micro_batch_size.",
        ),
        (
            1024,
            {"micro_batch_size": 64},
            (
                "micro_batch_size (64) is larger than max_micro_batch_size (48); lower micro_batch_size or "
                "raise max_micro_batch_size."
            ),
        ),
    ],
)
def test_bad_input_names_the_parameter(
    global_batch_size: Any, overrides: dict[str, Any], message: str
) -> None:
    assert error_of(global_batch_size, **overrides) == message


@pytest.mark.parametrize(
    ("make_options", "message"),
    [
        (lambda: Baseline(0.1, 0), "base_batch_size must be a positive integer, got 0."),
        (lambda: Baseline(-0.1, 256), "base_learning_rate must be a positive number, got -0.1."),
        (
            lambda: Baseline(0.1, 256, weight_decay=-1.0),
            "weight_decay must be a non-negative number, got -1.0.",
        ),
        (lambda: Scaling(scaling_rule="cubic"), "scaling_rule must be 'linear' or 'sqrt', got 'cubic'."),
        (
            lambda: Scaling(optimizer=" "),
            "optimizer must be an optimizer's name such as 'sgd' or 'adamw', got ' '.",
        ),
        (lambda: Scaling(warmup_steps=-1), "warmup_steps must be an integer >= 0, got -1."),
        (lambda: Scaling(steps_per_epoch=0), "steps_per_epoch must be a positive integer, got 0."),
    ],
)
def test_options_are_checked_once_when_made(make_options: Any, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        make_options()
    assert str(caught.value) == message


def test_options_are_frozen_and_the_common_call_is_short() -> None:
    baseline = Baseline(0.1, 256)
    with pytest.raises(FrozenInstanceError):
        baseline.base_batch_size = 512  # type: ignore[misc]
    assert plan(1024, baseline, world_size=8, max_micro_batch_size=48) == make(1024)
    assert batchfit.plan(1024, batchfit.Baseline(0.1, 256), world_size=8, max_micro_batch_size=48) == make(
        1024
    )
    # The rule by default: the optimizer's, linear while the optimizer is not known.
    assert (Scaling(), TrainingFacts()) == (Scaling(None), TrainingFacts(False))
    assert make(1024).scaling_rule == "linear"


def test_each_option_field_is_a_flag_with_the_same_default() -> None:
    commands = next(action for action in parser()._actions if action.dest == "command")
    plan_flags = {action.dest: action for action in commands.choices["plan"]._actions}  # type: ignore[attr-defined]
    for options in (Baseline, Scaling, TrainingFacts):
        for field in fields(options):
            flag = plan_flags[field.name]
            if field.default is dataclasses.MISSING:
                assert flag.required, field.name
            else:
                assert flag.default == field.default, field.name


def test_zero_weight_decay_is_accepted() -> None:
    assert make(1024, weight_decay=0.0, scale_weight_decay=True).weight_decay == 0.0


# The result ---------------------------------------------------------------------------------------


def test_summary_and_json() -> None:
    result = make(1024, uses_ema=True, weight_decay=1e-4, scale_weight_decay=True)
    assert result.table() == "\n".join(
        [
            "global_batch_size 1024 = micro_batch_size 32 x accumulation_steps 4 x world_size 8",
            "learning_rate 0.4 = base_learning_rate 0.1 x 1024 / 256 (linear rule)",
            (
                "scaling_rule linear: the rule for SGD (Goyal et al., 2017); the optimizer is not known "
                "(give optimizer: Adam-family ones take sqrt)"
            ),
            "warmup_steps 400 (recommended: 100 steps x learning-rate scale-up 4)",
            "weight_decay 0.0002 = 0.0001 x sqrt(4)",
            f"warning: {result.warnings[0]}",
            "",
        ]
    )
    # One paragraph: the quantities on one line, the rule's reason and the warnings left to the table.
    assert result.summary() == (
        "global_batch_size 1024 = micro_batch_size 32 x accumulation_steps 4 x world_size 8; "
        "learning_rate 0.4 = base_learning_rate 0.1 x 1024 / 256 (linear rule); "
        "warmup_steps 400 (recommended: 100 steps x learning-rate scale-up 4); "
        "weight_decay 0.0002 = 0.0001 x sqrt(4); 1 warning (see the table)."
    )
    document = json.loads(result.to_json())
    assert document == result.to_dict()
    fields = {field.name: document[field.name] for field in dataclasses.fields(Plan)}
    assert Plan(**{**fields, "warnings": tuple(document["warnings"])}) == result


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            {"scaling_rule": "sqrt"},
            "learning_rate 0.2 = base_learning_rate 0.1 x sqrt(1024 / 256) (sqrt rule)",
        ),
        ({"warmup_steps": 7}, "warmup_steps 7 (as given)"),
        ({"base_batch_size": 1024}, "warmup_steps 0 (recommended: the learning rate is not scaled up)"),
        (
            {"steps_per_epoch": 2},
            "warmup_steps 10 (recommended: 100 steps x learning-rate scale-up 4, capped at 5 epochs)",
        ),
        ({"weight_decay": 0.05}, "weight_decay 0.05 (unchanged)"),
    ],
)
def test_summary_lines(overrides: dict[str, Any], line: str) -> None:
    assert line in make(1024, **overrides).table().splitlines()


SQRT = "the learning rate with the square root of the batch (Malladi et al., 2022)"
LINEAR = "SGD scales the learning rate with the batch, after a warm-up (Goyal et al., 2017)"


@pytest.mark.parametrize(
    ("optimizer", "given", "rule", "reason"),
    [
        ("adam", None, "sqrt", f"sqrt: Adam-family optimizers scale {SQRT}"),
        ("AdamW", None, "sqrt", f"sqrt: Adam-family optimizers scale {SQRT}"),
        ("RMSprop", None, "sqrt", f"sqrt: RMSprop, like Adam, scales {SQRT}"),
        ("sgd", None, "linear", f"linear: {LINEAR}"),
        (
            None,
            None,
            "linear",
            (
                "linear: the rule for SGD (Goyal et al., 2017); the optimizer is not known (give optimizer: "
                "Adam-family ones take sqrt)"
            ),
        ),
        (
            "Lion",
            None,
            "linear",
            (
                "linear: the rule for SGD (Goyal et al., 2017); no rule is known for Lion (give scaling_rule "
                "to choose one)"
            ),
        ),
        (
            "adam",
            "linear",
            "linear",
            f"linear: as given (scaling_rule); adam would take sqrt: Adam-family optimizers scale {SQRT}",
        ),
        ("SGD", "sqrt", "sqrt", f"sqrt: as given (scaling_rule); SGD would take linear: {LINEAR}"),
        (None, "sqrt", "sqrt", "sqrt: as given (scaling_rule)"),
        ("adamw", "sqrt", "sqrt", "sqrt: as given (scaling_rule)"),
    ],
)
def test_the_rule_follows_the_optimizer_unless_given(
    optimizer: str | None, given: str | None, rule: str, reason: str
) -> None:
    result = make(1024, optimizer=optimizer, scaling_rule=given)
    assert (result.scaling_rule, result.scaling_reason, result.optimizer) == (rule, reason, optimizer)
    assert result.learning_rate == pytest.approx(0.2 if rule == "sqrt" else 0.4)  # k = 4
    assert f"scaling_rule {reason}" in result.table().splitlines()


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["Adam", "AdamW", "Adamax", "NAdam", "RAdam", "SparseAdam", "FusedAdam", "AdamW8bit"], "adam"),
        (["RMSprop", "rmsprop"], "rmsprop"),
        (["SGD", "sgd"], "sgd"),
        (["Adagrad", "Adadelta", "LBFGS", "Lion", "LAMB", "Adafactor", "ASGD"], None),
    ],
)
def test_optimizer_families_by_name(names: list[str], expected: str | None) -> None:
    assert {name: family(name) for name in names} == dict.fromkeys(names, expected)


def test_plan_module_does_not_import_torch() -> None:
    module = importlib.import_module(
        "batchfit.policy.plan.plan"
    )  # the module: batchfit.plan is also the function
    tree = ast.parse(Path(str(module.__file__)).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(name.split(".")[0] == "torch" for name in imported), imported


# The command line ---------------------------------------------------------------------------------

CLI = ["plan", "--global-batch-size", "1024", "--world-size", "8", "--max-micro-batch-size", "48"]
CLI += ["--base-learning-rate", "0.1", "--base-batch-size", "256"]


@pytest.mark.parametrize(
    ("flags", "overrides"),
    [
        ([], {}),
        (["--scaling-rule", "sqrt", "--warmup-steps", "0"], {"scaling_rule": "sqrt", "warmup_steps": 0}),
        (
            ["--weight-decay", "0.0001", "--scale-weight-decay", "--steps-per-epoch", "50"],
            {"weight_decay": 1e-4, "scale_weight_decay": True, "steps_per_epoch": 50},
        ),
        (
            ["--uses-batchnorm", "--uses-ema", "--fine-tuning", "--max-micro-batch-size", "8"],
            {"uses_batchnorm": True, "uses_ema": True, "fine_tuning": True, "max_micro_batch_size": 8},
        ),
        (["--micro-batch-size", "16"], {"micro_batch_size": 16}),
        (["--optimizer", "adam"], {"optimizer": "adam"}),
        (["--noise-scale", "300"], {"noise_scale": 300.0}),
        (
            ["--optimizer", "adam", "--scaling-rule", "linear"],
            {"optimizer": "adam", "scaling_rule": "linear"},
        ),
    ],
)
def test_cli_plan_prints_the_summary(
    flags: list[str], overrides: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*CLI, *flags]) == 0
    out, err = capsys.readouterr()
    assert out == make(1024, **overrides).table()
    assert err == ""


def test_cli_plan_for_adam_takes_the_square_root_rule_and_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Adam tuned at 0.001 for 256: linear scaling gave 0.004 at 1024; the square-root rule 0.002.
    argv = [*CLI[:-4], "--base-learning-rate", "0.001", "--base-batch-size", "256", "--optimizer", "adam"]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines() == [
        "global_batch_size 1024 = micro_batch_size 32 x accumulation_steps 4 x world_size 8",
        "learning_rate 0.002 = base_learning_rate 0.001 x sqrt(1024 / 256) (sqrt rule)",
        (
            "scaling_rule sqrt: Adam-family optimizers scale the learning rate with the square root of the "
            "batch (Malladi et al., 2022)"
        ),
        "warmup_steps 200 (recommended: 100 steps x learning-rate scale-up 2)",
    ]


def test_cli_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CLI, "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document.pop("versions")["batchfit"] == batchfit.__version__
    assert isinstance(document.pop("created_at"), str)  # what ran, for a report
    assert (document.pop("command"), document.pop("workload")) == ("plan", None)
    assert document == {"results": [make(1024).to_dict()]}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--global-batch-size", "1000", "--micro-batch-size", "48"],
            (
                "global_batch_size (1000) is not divisible by world_size x micro_batch_size (8 x 48 = 384); "
                "768 or 1152 would work."
            ),
        ),
        (["--base-learning-rate", "0"], "base_learning_rate must be a positive number, got 0.0."),
        (["--world-size", "0"], "world_size must be a positive integer, got 0."),
    ],
)
def test_cli_plan_error_is_one_line(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*CLI, *flags]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"batchfit: error: {message}", HINT]


def test_cli_plan_in_a_real_process() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "batchfit", *CLI, "--uses-ema", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (run.returncode, run.stderr) == (0, "")
    document = json.loads(run.stdout)
    assert {"command", "versions", "created_at"} <= document.keys()
    assert document["results"] == [make(1024, uses_ema=True).to_dict()]
