"""``predict`` from the CPU alone by a fake-tensor trace of its trials: the trace's requests are the
real CPU trials' request for request, so the predictions are the same; a model too large to allocate
(built on the meta device) is predicted without allocating it; a step that cannot be traced falls
back to the real trials and says why; the model, optimizer and RNG are left as they were."""

from __future__ import annotations

import dataclasses
import random
import resource
import time
from typing import Any

import pytest
import torch
from torch import nn

import batchfit
from batchfit import ConfigurationError, Targets, Trials
from batchfit.prediction.cpu_alone import cuda_defaults
from batchfit.prediction.predict import CPU_RECORDING_BYTES, record, record_traced
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.steps.attention import CudaAttention
from batchfit.runtime.workloads.examples import TinyLM, build_example

GiB = 2**30


def reading(workload: batchfit.Workload) -> batchfit.Workload:
    """``workload`` whose steps are its own default steps, each reading its loss (``.item()``): the
    same requests, but a fake tensor has no value to read, so its step cannot be traced."""

    def read(loss: Any) -> None:
        float(loss.item())

    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
        workload.run_train_step(optimizer, batch, read)

    def eval_step(model: nn.Module, batch: Any) -> None:
        workload.run_eval_step(batch, read)

    return dataclasses.replace(workload, train_step=train_step, eval_step=eval_step)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_the_trace_makes_the_real_cpu_trials_requests_request_for_request(name: str, mode: str) -> None:
    workload = build_example(name, "cpu")
    with cuda_defaults(workload.optimizer):  # as predict records from the CPU alone
        real, ran = record(workload, mode, CachingCpuDevice(CPU_RECORDING_BYTES), 0.8, Trials(), 1)  # type: ignore[arg-type]
        attention = CudaAttention()
        traced, traces = record_traced(workload, mode, 0.8, Trials(), 1, attention)  # type: ignore[arg-type]
    assert sorted(traced) == sorted(real) == [2, 4, 8]
    if attention.fused:  # attention as CUDA's fused kernel (the encoder's eval): less than the math path
        assert all(t.peak_bytes <= r.peak_bytes for t, r in zip(traces, ran, strict=True))
        return
    assert traced == real  # every request's size, its order, every free and the step marks
    assert [(t.batch_size, t.peak_bytes, t.reserved_peak_bytes) for t in traces] == [
        (t.batch_size, t.peak_bytes, t.reserved_peak_bytes) for t in ran
    ]
    assert all(trace.step_seconds is None for trace in traces)  # a trace times nothing


def test_traced_and_untraceable_twins_predict_the_same_and_the_twin_says_why() -> None:
    targets = Targets(gpus="T4")
    traced = batchfit.predict(build_example("transformer", "cpu"), targets, device="cpu")
    real = batchfit.predict(reading(build_example("transformer", "cpu")), targets, device="cpu")
    assert traced.recorded_by == {"train": "trace", "eval": "trace"} and traced.untraced == {}
    assert real.recorded_by == {"train": "trials", "eval": "trials"}
    assert real.records == traced.records
    assert real.rows == traced.rows
    why = real.untraced["train"]
    assert why.startswith("it reads a tensor's value, as .item(), float() or a shape set by the data do: ")
    assert f"train by real trials, as no trace could be ({why})" in real.summary()
    assert "(train and eval by a fake-tensor trace of the trials, nothing allocated)" in traced.summary()
    assert traced.table().endswith("recorded by: train a fake-tensor trace, eval a fake-tensor trace\n")
    assert real.table().endswith("recorded by: train real trials, eval real trials\n")
    assert traced.to_dict()["recorded_by"] == {"train": "trace", "eval": "trace"}


def test_the_trace_leaves_the_model_optimizer_and_rng_as_they_were() -> None:
    workload = build_example("cnn", "cpu")  # BatchNorm's statistics and counter, SGD's momentum
    batch = workload.host_batch(4)
    workload.run_train_step(workload.optimizer, batch)  # type: ignore[arg-type]
    optimizer = workload.optimizer
    assert isinstance(optimizer, torch.optim.Optimizer)
    state = {name: tensor.clone() for name, tensor in workload.module.state_dict().items()}
    grads = [parameter.grad.clone() for parameter in workload.module.parameters()]  # type: ignore[union-attr]
    momenta = [optimizer.state[p]["momentum_buffer"].clone() for p in workload.module.parameters()]
    groups = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    torch_rng, python_rng = torch.get_rng_state(), random.getstate()
    prediction = batchfit.predict(workload, Targets("1GiB"), device="cpu")
    assert prediction.recorded_by == {"train": "trace", "eval": "trace"}
    after = workload.module.state_dict()
    assert all(torch.equal(state[name], after[name]) for name in state)
    assert all(
        torch.equal(grad, p.grad)  # type: ignore[arg-type]
        for grad, p in zip(grads, workload.module.parameters(), strict=True)
    )
    assert all(
        torch.equal(m, optimizer.state[p]["momentum_buffer"])
        for m, p in zip(momenta, workload.module.parameters(), strict=True)
    )
    assert groups == [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    assert torch.equal(torch_rng, torch.get_rng_state()) and python_rng == random.getstate()
    assert workload.module.training


def _meta_lm(train_step: Any = None) -> tuple[batchfit.Workload, int]:
    """A causal LM of 2.4 billion parameters (9.1 GiB in float32, 36 GiB with its gradients and
    AdamW's two moments) on the meta device: nothing allocated; and its parameters' bytes."""
    with torch.device("meta"):
        model = TinyLM(vocab=32000, seq_len=512, width=4096, layers=12)
    tokens = 512

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, 32000, (n, tokens + 1), generator=torch.Generator().manual_seed(n))
        return ids[:, :-1], ids[:, 1:]

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    workload = batchfit.Workload(
        model, torch.optim.AdamW(model.parameters()), make_batch=make_batch, loss_fn=loss_fn
    )
    workload.train_step = train_step
    return workload, sum(p.numel() * p.element_size() for p in model.parameters())


def test_a_model_too_large_to_allocate_is_predicted_from_the_meta_device_in_seconds() -> None:
    workload, parameter_bytes = _meta_lm()
    assert parameter_bytes > 9 * GiB
    grown_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, the process's peak
    started = time.perf_counter()
    targets = Targets(gpus="H100-80GB,A100-40GB")
    prediction = batchfit.predict(workload, targets, modes=["train"], device="cpu")
    seconds = time.perf_counter() - started
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - grown_before
    assert seconds < 20 and grown < 2**20  # under a GiB more at the process's peak: nothing allocated
    assert prediction.recorded_by == {"train": "trace"}
    h100, a100 = (row.train for row in prediction.rows)
    assert h100 is not None and a100 is not None
    # On 40 GB the model, its gradients and AdamW's moments (36 GiB) leave no room for a batch.
    assert a100.batch_size is None
    assert h100.batch_size is not None and h100.batch_size >= 2
    assert h100.peak_allocated_bytes is not None and h100.peak_allocated_bytes > 4 * parameter_bytes
    assert h100.peak_reserved_bytes is not None and h100.peak_reserved_bytes <= h100.budget_bytes
    assert all(p.is_meta for p in workload.module.parameters()) and not workload.optimizer.state  # type: ignore[union-attr]


def test_a_meta_model_whose_step_cannot_be_traced_is_refused_with_why() -> None:
    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
        float(model(batch[0]).sum().item())

    workload, _ = _meta_lm(train_step)
    with pytest.raises(ConfigurationError) as raised:
        batchfit.predict(workload, Targets(gpus="H100-80GB"), modes=["train"], device="cpu")
    said = str(raised.value)
    assert said.startswith("the train step cannot run on fake tensors (it reads a tensor's value")
    assert said.endswith(
        "and the model's position is on the meta device, where no real trial runs: build the model on "
        "the CPU, or make its step traceable (no .item() or data-dependent shapes)."
    )


@pytest.mark.slow  # GPT-2's real trials: about 20 s on 2 cores
def test_gpt2_builds_its_causal_mask_on_fake_tensors_so_the_trace_answers_lower() -> None:
    # transformers' is_tracing() is true of a fake tensor, and then its masking_utils do not skip
    # the causal mask (SDPA's is_causal=True) but build it: the trace asks for more in every step
    # (the mask and its temporaries), so its answers are at most the real trials' (the bound it holds).
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import _workloads

    from batchfit.policy.capacity.capacity_prediction import CapacityPredictor

    workload = _workloads.build("gpt2-tiny", torch.device("cpu"))
    with cuda_defaults(workload.optimizer):
        real, _ = record(workload, "train", CachingCpuDevice(CPU_RECORDING_BYTES), 0.8, Trials(), 1)
        traced, _ = record_traced(workload, "train", 0.8, Trials(), 1)
    assert traced != real

    def asked(steps: tuple[tuple[tuple[int, int], ...], ...]) -> list[int]:
        return [sum(size for kind, size in step if kind == 0) for step in steps]

    for size in (2, 4, 8):
        assert all(t >= r for t, r in zip(asked(traced[size].steps), asked(real[size].steps), strict=True))
    candidates = batchfit.BatchSizes().candidates("train")
    for budget in (GiB // 2, 2 * GiB):
        ours, theirs = CapacityPredictor(traced, 10), CapacityPredictor(real, 10)
        assert ours.largest(budget, candidates) <= theirs.largest(budget, candidates)  # type: ignore[operator]
