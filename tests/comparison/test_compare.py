"""compare on real models under a real cap: each technique's largest batch is the truth by force,
and everything is left as it was."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from compiled_workloads import compiled_truth, pointwise_model
from compiled_workloads import make_batch as pointwise_batch
from tiny_workloads import blocks_cnn, build, lbfgs_mlp

from batchfit import (
    BatchSizes,
    ConfigurationError,
    Timing,
    Workload,
    cap_memory,
    compare,
)
from batchfit.runtime.steps.techniques import applied, compiler_unavailable

#: Steps each probe of the truth trains (the search's trials train 2).
TRUTH_STEPS = 10


def fits(parts: tuple[str, ...], budget: int, batch_size: int) -> bool:
    """Whether TRUTH_STEPS steps of the freshly built blocks CNN, with ``parts`` applied, complete
    under a hard cap of ``budget`` bytes."""
    workload = blocks_cnn()
    optimizer = workload.build_optimizer()
    with applied(workload, parts, torch.device("cpu"), block="Sequential") as (variant, _):
        host = variant.host_batch(batch_size)
        try:
            with cap_memory(budget, resident=[workload.model, optimizer]):
                for _ in range(TRUTH_STEPS):
                    variant.run_train_step(optimizer, [tensor.clone() for tensor in host])
        except torch.OutOfMemoryError:
            return False
    return True


@pytest.fixture(scope="module")
def comparison() -> Any:
    # The example cnn's shape at a sixtieth of its work a sample, under a sixteenth of its 64 MiB: each
    # row trains under autocast too, which runs about 20x slower on a CPU without bfloat16 kernels.
    return compare(
        blocks_cnn(),
        ["amp", "checkpointing", "amp+checkpointing", "amp-fp16"],
        device="cpu",
        memory_limit="4MiB",
        sizes=BatchSizes(global_batch_size=96),
        timing=Timing(windows=1, time_budget_seconds=0, time_slow=True),
    )


def test_each_technique_s_largest_batch_is_the_truth_under_the_cap(comparison: Any) -> None:
    rows = {row.technique: row for row in comparison.rows}
    assert list(rows) == ["baseline", "amp", "checkpointing", "amp+checkpointing", "amp-fp16", "accumulation"]
    assert rows["amp"].note == "autocast bfloat16"
    # What a GPU without bfloat16 runs, here on the CPU: float16, its loss scaled.
    assert rows["amp-fp16"].note == "autocast float16 with a GradScaler"
    for name, parts in (
        ("baseline", ()),
        ("amp", ("amp",)),
        ("checkpointing", ("checkpointing",)),
        ("amp+checkpointing", ("amp", "checkpointing")),
        ("amp-fp16", ("amp-fp16",)),
    ):
        # The answer and the size below it train TRUTH_STEPS steps under the cap; the next does not.
        answer = rows[name].batch_size
        window = range(answer - 1, answer + 2)
        fitting = [batch for batch in window if fits(parts, comparison.budget_bytes, batch)]
        assert fitting == [answer - 1, answer], (name, answer, fitting)
    # What each buys on this BatchNorm CNN, measured: mixed precision and checkpointing both raise
    # the largest batch, and together most.
    baseline = rows["baseline"].batch_size
    assert baseline < rows["checkpointing"].batch_size < rows["amp+checkpointing"].batch_size
    assert baseline < rows["amp"].batch_size < rows["amp+checkpointing"].batch_size
    assert rows["amp"].batch_ratio == rows["amp"].batch_size / baseline
    assert rows["amp"].bytes_per_sample < rows["baseline"].bytes_per_sample
    assert not any(row.at_max_batch_size for row in comparison.rows)


def test_accumulation_reaches_the_global_batch_from_the_baseline_s_largest(comparison: Any) -> None:
    baseline, accumulation = comparison.rows[0], comparison.rows[-1]
    assert accumulation.technique == "accumulation" and accumulation.applied
    assert accumulation.batch_size * accumulation.accumulation_steps == 96
    assert accumulation.batch_size <= baseline.batch_size < 2 * accumulation.batch_size
    assert accumulation.samples_per_second > 0 and accumulation.throughput_ratio is not None


def test_the_outputs_carry_every_row(comparison: Any) -> None:
    table = comparison.table()
    assert all(row.technique in table for row in comparison.rows)
    assert comparison.to_dict()["rows"][1]["technique"] == "amp"
    lines = comparison.to_csv().splitlines()
    assert lines[0].startswith("technique,applied,note,batch_size") and len(lines) == 1 + len(comparison.rows)


def test_compare_leaves_the_model_optimizer_and_rng_as_they_were() -> None:
    workload = build("cnn", "adam")
    workload.run_train_step(workload.optimizer, workload.host_batch(4))  # optimizer state exists
    weights = {name: value.clone() for name, value in workload.model.state_dict().items()}
    state = {key: {k: v.clone() for k, v in value.items()} for key, value in workload.optimizer.state.items()}
    rng = torch.get_rng_state()
    gradients = [parameter.grad.clone() for parameter in workload.model.parameters()]
    compare(
        workload,
        ["amp"],
        device="cpu",
        memory_limit="16MiB",
        timing=Timing(windows=1, time_budget_seconds=0, time_slow=True),
    )
    assert all(torch.equal(value, weights[name]) for name, value in workload.model.state_dict().items())
    for key, value in workload.optimizer.state.items():
        assert all(torch.equal(v, state[key][k]) for k, v in value.items())
    assert torch.equal(torch.get_rng_state(), rng)
    got = [parameter.grad for parameter in workload.model.parameters()]
    assert all(torch.equal(now, then) for now, then in zip(got, gradients, strict=True))


def test_a_technique_that_cannot_wrap_the_step_says_why_and_the_others_run() -> None:
    workload: Workload = build("mlp", "sgd")
    default = workload

    def train_step(model: torch.nn.Module, optimizer: Any, batch: Any) -> None:
        default.train_step = None
        default.run_train_step(optimizer, batch)
        default.train_step = train_step

    workload.train_step = train_step
    result = compare(
        workload,
        ["amp", "checkpointing"],
        device="cpu",
        memory_limit="8MiB",
        timing=Timing(windows=1, time_budget_seconds=0, time_slow=True),
    )
    baseline, amp, checkpointing = result.rows
    assert baseline.applied and baseline.batch_size is not None
    assert baseline.at_max_batch_size and baseline.batch_size == 512  # the tiny MLP fits up to the bound
    assert not amp.applied and amp.note.startswith("amp: the workload has its own train_step")
    assert not checkpointing.applied and "no repeated block" in checkpointing.note


def test_an_optimizer_that_needs_a_closure_runs_every_row_a_closure_allows() -> None:
    # L-BFGS: bfloat16 and accumulation step it with a closure; float16's GradScaler cannot, and
    # the row says so instead of the comparison failing at its first trial.
    result = compare(
        lbfgs_mlp(),
        ["amp", "amp-fp16", "accumulation"],
        device="cpu",
        memory_limit="8MiB",
        sizes=BatchSizes(global_batch_size=1024),
        timing=Timing(windows=1, time_budget_seconds=0, time_slow=True),
    )
    baseline, amp, fp16, accumulation = result.rows
    assert baseline.batch_size is not None and amp.batch_size is not None and amp.note == "autocast bfloat16"
    assert not fp16.applied and "cannot step one that needs a closure (L-BFGS); amp-bf16 can" in fp16.note
    assert accumulation.batch_size is not None and accumulation.samples_per_second is not None
    with (
        applied(lbfgs_mlp(), ("amp-fp16",), torch.device("cpu")) as (variant, _),
        pytest.raises(ConfigurationError, match="a GradScaler, which cannot step LBFGS"),
    ):
        variant.run_train_step(variant.build_optimizer(), variant.host_batch(2))


def test_bad_settings_are_refused_before_any_work() -> None:
    with pytest.raises(ConfigurationError, match=r"^windows must be a positive integer, got 0\.$"):
        compare(build("mlp"), timing=Timing(windows=0))
    with pytest.raises(ConfigurationError, match=r"^technique 'fast': 'fast' is not one of"):
        compare(build("mlp"), ["fast"], device="cpu")


def test_the_throughput_ratio_pairs_readings_within_each_round() -> None:
    # Round 2 ran in a slow spell for both rows; round 3 caught the row alone in one. Paired
    # within each round, the ratios are 1.5, 1.5 and 0.6: the median says 1.5, where the ratio of
    # the medians (90 / 100) would say 0.9.
    from batchfit.comparison.comparison import ComparisonRow, against

    baseline = ComparisonRow("baseline", True, "as given", batch_size=100)
    row = ComparisonRow("amp", True, "autocast bfloat16", batch_size=150)
    measured = against(row, baseline, [150.0, 90.0, 60.0], [100.0, 60.0, 100.0])
    assert measured.samples_per_second == 90.0
    assert measured.throughput_ratio == 1.5 and measured.batch_ratio == 1.5
    # The spell shows in the 90% interval: three readings this far apart cannot tell 1.5 from 1.
    assert measured.throughput_ratio_low is not None and measured.throughput_ratio_high is not None
    assert measured.throughput_ratio_low < 1 < measured.throughput_ratio_high and measured.within_noise
    steady = against(row, baseline, [150.0, 92.0, 148.0], [100.0, 60.0, 100.0])
    assert steady.throughput_ratio == 1.5 and not steady.within_noise
    interval = (steady.throughput_ratio_low or 0, steady.throughput_ratio_high or 0)
    assert (round(interval[0], 2), round(interval[1], 2)) == (1.46, 1.55)
    # The baseline against itself is 1 by definition, with no interval; one reading has none either.
    itself = against(baseline, baseline, [100.0, 60.0, 100.0], [100.0, 60.0, 100.0])
    assert (itself.throughput_ratio, itself.throughput_ratio_low, itself.throughput_ratio_high) == (
        1.0,
        None,
        None,
    )
    once = against(row, baseline, [150.0], [100.0])
    assert (once.throughput_ratio, once.throughput_ratio_low, once.within_noise) == (1.5, None, False)


def test_the_table_prints_each_ratio_with_its_interval_and_marks_noise() -> None:
    from batchfit.comparison.comparison import Comparison, ComparisonRow, against

    baseline = ComparisonRow("baseline", True, "as given", batch_size=140, peak_bytes=200 << 20)
    amp = ComparisonRow("amp", True, "autocast bfloat16", batch_size=250, peak_bytes=200 << 20)
    checkpointing = ComparisonRow("checkpointing", True, "3 blocks", batch_size=179, peak_bytes=200 << 20)
    readings = [100.0, 104.0, 98.0]
    rows = (
        against(baseline, baseline, readings, readings),
        against(amp, baseline, [190.0, 200.0, 185.0], readings),
        against(checkpointing, baseline, [90.0, 110.0, 93.0], readings),
        ComparisonRow("cudnn-benchmark-on", False, "cudnn-benchmark-on: needs CUDA"),
    )
    table = Comparison(rows, "cpu", 0.8, 160 << 20, "samples/s", None, 1.0).table()
    assert table.splitlines() == [
        (
            "technique              batch_size x batch        peak  per sample    samples/s recommended  "
            "x speed [90% interval]"
        ),
        "baseline                      140   1.00x  200.00 MiB           -        100.0           -  1.00x",
        (
            "amp                           250   1.79x  200.00 MiB           -        190.0           -  "
            "1.90x [1.87, 1.93]"
        ),
        (
            "checkpointing                 179   1.28x  200.00 MiB           -         93.0           -  "
            "0.95x [0.84, 1.11] (within noise)"
        ),
        "cudnn-benchmark-on              -  cudnn-benchmark-on: needs CUDA",
        (
            "within noise: the speed ratio's interval includes 1.00x; the readings cannot tell it from "
            "no change (more windows, --windows, narrow it)."
        ),
        "on cpu, memory_fraction 0.8; how each applied:",
        "  baseline: as given",
        "  amp: autocast bfloat16",
        "  checkpointing: 3 blocks",
    ]


def test_the_compile_row_is_the_compiled_step_s_truth_and_the_model_stays_eager() -> None:
    # Not a default (it compiles at each row); named, it compiles the model as torch.compile does.
    if reason := compiler_unavailable("cpu"):
        pytest.skip(reason)
    torch.manual_seed(0)
    model = pointwise_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    workload = Workload(
        model, optimizer, make_batch=pointwise_batch, loss_fn=torch.nn.functional.cross_entropy
    )
    result = compare(
        workload,
        ["compile"],
        device="cpu",
        memory_limit="64MiB",
        sizes=BatchSizes(max_batch_size=8192),
        timing=Timing(time_budget_seconds=0, time_slow=True),
    )
    baseline, compiled = result.rows
    assert compiled.applied and compiled.note == "torch.compile", compiled
    assert compiled.batch_size is not None and baseline.batch_size is not None
    truth = compiled_truth([compiled.batch_size, compiled.batch_size + 1])
    assert truth[compiled.batch_size] <= result.budget_bytes < truth[compiled.batch_size + 1]
    assert compiled.batch_size > 2 * baseline.batch_size  # Inductor keeps a third of eager's activations
    assert workload.compiled == () and workload.model is model  # the user's model is not compiled
