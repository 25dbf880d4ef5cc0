"""compare's techniques in plain Python: names, defaults, which apply, the repeated block."""

from __future__ import annotations

import dataclasses

import pytest

from batchfit.errors import ConfigurationError
from batchfit.policy.explore.techniques import (
    Facts,
    default_settings,
    parse_settings,
    repeated_block,
    why_not,
)

CPU = Facts(cuda=False, custom_train_step=False, repeated_block="Block")


def test_settings_start_with_the_baseline_once_and_drop_repeats() -> None:
    assert parse_settings(["amp", "baseline", " amp ", "amp+checkpointing", "accumulation"]) == [
        (),
        ("amp",),
        ("amp", "checkpointing"),
        ("accumulation",),
    ]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "amp+fp8",
            (
                "technique 'amp+fp8': 'fp8' is not one of amp, amp-fp16, amp-bf16, checkpointing, compile, "
                "cudnn-benchmark-on, cudnn-benchmark-off, expandable-segments (combined with '+', e.g. "
                "amp+checkpointing), baseline or accumulation."
            ),
        ),
        (
            "cudnn-benchmark-on+cudnn-benchmark-off",
            "technique 'cudnn-benchmark-on+cudnn-benchmark-off' turns cuDNN's benchmark both on and off.",
        ),
        (
            "amp-fp16+checkpointing+amp",
            (
                "technique 'amp-fp16+checkpointing+amp' names mixed precision twice: choose one of amp "
                "(the device's usual dtype), amp-fp16 (float16 with a GradScaler) or amp-bf16."
            ),
        ),
    ],
)
def test_bad_names_are_refused_with_the_choices(name: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_settings([name])
    assert str(raised.value) == message


def test_the_defaults_follow_the_device_and_the_global_batch() -> None:
    assert default_settings(CPU, cudnn_benchmark=False) == [
        (),
        ("amp",),
        ("checkpointing",),
        ("amp", "checkpointing"),
    ]
    cuda = Facts(cuda=True, custom_train_step=False, repeated_block=None, global_batch_size=1024)
    assert default_settings(cuda, cudnn_benchmark=False)[-3:] == [
        ("cudnn-benchmark-on",),
        ("expandable-segments",),
        ("accumulation",),
    ]
    assert ("cudnn-benchmark-off",) in default_settings(cuda, cudnn_benchmark=True)
    # An allocator that makes expandable segments already: the baseline has them.
    expandable = dataclasses.replace(cuda, expandable_segments=True)
    assert ("expandable-segments",) not in default_settings(expandable, cudnn_benchmark=False)


def test_expandable_segments_apply_on_cuda_where_the_allocator_does_not_make_them_already() -> None:
    cuda = Facts(cuda=True, custom_train_step=True, repeated_block=None)
    assert why_not(("expandable-segments",), cuda) is None  # the workload's own step: the allocator's setting
    assert why_not(("expandable-segments",), CPU) == (
        "expandable segments are CUDA's caching allocator's (PYTORCH_CUDA_ALLOC_CONF)"
    )
    reason = why_not(("amp", "expandable-segments"), dataclasses.replace(cuda, expandable_segments=True))
    assert reason is not None and reason.endswith("so the baseline has them")


def test_a_technique_that_cannot_apply_says_why() -> None:
    assert why_not(("amp", "checkpointing"), CPU) is None
    custom = Facts(cuda=False, custom_train_step=True, repeated_block=None)
    reason = why_not(("amp", "checkpointing", "cudnn-benchmark-on"), custom)
    assert reason is not None
    assert reason.startswith("amp: the workload has its own train_step")
    assert "checkpointing: the model has no repeated block" in reason
    assert reason.endswith("cuDNN's benchmark needs CUDA")
    assert (
        why_not(("accumulation",), CPU) == "accumulation needs global_batch_size, the global batch to reach"
    )
    assert why_not(("amp-fp16", "checkpointing"), custom) is not None
    assert why_not(("amp-fp16",), custom) == (
        "amp-fp16: the workload has its own train_step, which batchfit cannot wrap in autocast (add "
        "autocast and a GradScaler to the train_step and compare it as the baseline)"
    )


def test_bfloat16_applies_only_where_the_device_runs_it() -> None:
    # A V100 or T4 (before Ampere) has no bfloat16: amp there is float16 with a GradScaler.
    volta = Facts(cuda=True, custom_train_step=False, repeated_block="Block", bfloat16=False)
    assert why_not(("amp-bf16",), volta) == (
        "amp-bf16: this GPU does not run bfloat16 (amp-fp16 does, with a GradScaler)"
    )
    assert why_not(("amp",), volta) is None and why_not(("amp-fp16", "checkpointing"), volta) is None
    assert why_not(("amp-bf16",), CPU) is None


def test_float16_cannot_step_an_optimizer_that_needs_a_closure() -> None:
    # A GradScaler steps the optimizer itself and refuses a closure: L-BFGS trains in full
    # precision or bfloat16, which needs no scaler.
    cpu = Facts(cuda=False, custom_train_step=False, repeated_block=None, closure_optimizer=True)
    assert why_not(("amp-fp16",), cpu) == (
        "amp-fp16: float16 steps the optimizer through a GradScaler, which cannot step one that needs "
        "a closure (L-BFGS); amp-bf16 can"
    )
    assert why_not(("amp",), cpu) is None and why_not(("amp-bf16",), cpu) is None
    volta = Facts(
        cuda=True, custom_train_step=False, repeated_block=None, bfloat16=False, closure_optimizer=True
    )
    assert why_not(("amp",), volta) == (
        "amp: float16 steps the optimizer through a GradScaler, which cannot step one that needs a "
        "closure (L-BFGS)"
    )


def test_the_repeated_block_is_the_most_frequent_block_type() -> None:
    blocks = [("Layer", True), ("Linear", False), ("Linear", False), ("Layer", True), ("Stage", True)]
    assert repeated_block(blocks) == "Layer"  # Linear is more frequent but not a block
    assert repeated_block([("Stage", True), ("Layer", True), ("Layer", True), ("Stage", True)]) == "Stage"
    assert repeated_block([("Stage", True), ("Linear", False), ("Linear", False)]) is None


def test_compile_is_named_not_default_and_says_why_not_where_it_cannot_apply() -> None:
    assert ("compile",) not in default_settings(CPU, cudnn_benchmark=False)
    assert parse_settings(["amp+compile"]) == [(), ("amp", "compile")]
    assert why_not(("compile",), CPU) is None
    compiled = Facts(
        cuda=False, custom_train_step=False, repeated_block=None, compiled=("OptimizedModule (the model)",)
    )
    assert why_not(("amp", "compile"), compiled) == (
        "compile: the workload runs compiled code already (OptimizedModule (the model)), so its baseline "
        "is the compiled one; compare the eager model to see what compile buys"
    )
    no_compiler = Facts(cuda=False, custom_train_step=False, repeated_block=None, compiler="no C++ compiler")
    assert why_not(("compile",), no_compiler) == "compile: no C++ compiler"
