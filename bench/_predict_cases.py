"""The cases of ``bench/predict.py``: which workload is recorded under which cap and predicted under
which targets, in which modes, on each kind of device, and the few a device call runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, replace

from _capped import CPU_CACHING

from batchfit.policy.search.trial import Mode

#: ``recorded`` for a case predicted from the CPU alone only, on the modelled allocator: its
#: truth holds what that path adds for CUDA (cuBLAS's workspace, a foreach optimizer step).
CPU_ALONE = "cpu-alone"


@dataclass(frozen=True)
class PredictCase:
    """A workload recorded under ``recorded`` and predicted under each of ``targets`` (sizes, or
    ``ref:B``: what a 2-step trial at ``B`` reserved, rounded up to a MiB), in each of ``modes``;
    ``cpu_alone``: also predicted from the CPU alone (``predict --device cpu``'s path), judged on
    the same truths. ``recorded=CPU_ALONE``: predicted from the CPU alone only, its band widened by
    the parts the CPU does not model, judged on a truth that holds what that path adds for CUDA."""

    workload: str
    recorded: str
    targets: tuple[str, ...]
    cpu_alone: bool = False
    modes: tuple[Mode, ...] = ("train", "eval")


def _gpu_cases(top: str) -> list[PredictCase]:
    up, down = ("24GiB", "40GiB", top), ("24GiB", "16GiB")
    return [
        case
        for name in ("resnet50", "resnet50-amp", "vit-b16", "gpt2", "mlp", "cnn", "transformer")
        for case in (
            PredictCase(name, "16GiB", up, cpu_alone=name in ("resnet50", "gpt2"), modes=("train",)),
            PredictCase(name, top, down, modes=("train",)),
        )
    ]


#: On the modelled allocator: recorded where batch 8 fits, predicted at one cap below and two above,
#: answers near 8, 24 and 32 (the truth's scan at 64 takes minutes a case on 2 cores), train and
#: eval, and the cnn and the transformer from the CPU alone at the top one with room for cuBLAS's
#: two workspaces, training: every row's scan is a minute or less on 2 shared cores. A cap is what
#: a reference batch reserved, or a size where that is another's (segments come in 2 MiB steps: the
#: cnn's batch 24 reserves what its 16 does). The mlp is left out: its memory is nearly all fixed,
#: so caps a MiB apart are hundreds of samples apart, and its scan near 512 takes 4 minutes.
CASES: dict[str, Callable[[str], list[PredictCase]]] = {
    CPU_CACHING: lambda _: [
        PredictCase("cnn", "ref:16", ("ref:8", "54MiB", "ref:32"), modes=("train",)),
        PredictCase("transformer", "ref:16", ("ref:8", "ref:24", "ref:32"), modes=("train",)),
        PredictCase("gpt2-tiny", "ref:12", ("ref:6", "ref:16", "ref:24"), modes=("train",)),
        PredictCase("cnn", "ref:16", ("ref:8", "54MiB", "ref:32"), modes=("eval",)),
        PredictCase("transformer", "ref:16", ("ref:8", "ref:24", "ref:32"), modes=("eval",)),
        PredictCase("gpt2-tiny", "ref:12", ("ref:6", "ref:16", "ref:24"), modes=("eval",)),
        PredictCase("cnn", CPU_ALONE, ("ref:32+64MiB",), modes=("train",)),
        PredictCase("transformer", CPU_ALONE, ("ref:32+64MiB",), modes=("train",)),
    ],
    "cuda": _gpu_cases,
}


QUICK: dict[str, Callable[[str], list[PredictCase]]] = {
    CPU_CACHING: lambda _: [
        PredictCase("cnn", "ref:16", ("54MiB",)),
        PredictCase("cnn", CPU_ALONE, ("118MiB",)),
    ],
    "cuda": lambda top: [PredictCase("cnn", "16GiB", ("24GiB", top), modes=("train",))],
}


def select(
    parser: argparse.ArgumentParser, kind: str, args: argparse.Namespace, top: str
) -> list[PredictCase]:
    """The cases on this kind of device (``--quick``'s few, or all), kept to ``--workloads``, and
    each case's targets to ``--targets`` (cases left with none are dropped): on a GPU the truth's
    scans at 40 and 80 GiB take many minutes each, so a device call runs a few."""
    cases = (QUICK if args.quick else CASES)[kind](top)
    if args.workloads is not None:
        wanted = args.workloads.split(",")
        unknown = sorted(set(wanted) - {case.workload for case in CASES[kind](top)})
        if unknown:
            parser.error(f"unknown workload(s) {', '.join(unknown)} on {kind}")
        cases = [case for case in cases if case.workload in wanted]
    if args.targets is not None:
        kept = set(args.targets.split(","))
        cases = [replace(case, targets=tuple(t for t in case.targets if t in kept)) for case in cases]
        cases = [case for case in cases if case.targets]
        if not cases:
            parser.error(f"no case has a target among {args.targets} on {kind}")
    return cases
