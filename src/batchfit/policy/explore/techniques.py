"""The techniques ``compare`` applies, free of torch: their names, the default set for a device,
which one applies to a workload (and why not), and the repeated block that checkpointing wraps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from batchfit.errors import ConfigurationError

BASELINE = "baseline"
ACCUMULATION = "accumulation"
#: Mixed precision: ``amp`` in the device's usual dtype (bfloat16 where it runs, else float16
#: with a GradScaler), or one named: ``amp-fp16`` (always with a GradScaler) or ``amp-bf16``.
MIXED_PRECISION = ("amp", "amp-fp16", "amp-bf16")
#: ``torch.compile`` of the model (Inductor): not among the defaults, as it compiles at each row.
COMPILE = "compile"
#: CUDA's caching allocator with expandable segments (``expandable_segments:True``), against the
#: fragmentation its default segments leave near the cap.
EXPANDABLE_SEGMENTS = "expandable-segments"
#: The techniques a setting combines with "+" (``amp+checkpointing``).
TECHNIQUES = (
    *MIXED_PRECISION,
    "checkpointing",
    COMPILE,
    "cudnn-benchmark-on",
    "cudnn-benchmark-off",
    EXPANDABLE_SEGMENTS,
)
#: A technique whose step at the same batch takes this many times the baseline's is reported at
#: once, unsearched: no larger batch it could fit makes up a 3x loss per sample, and a search and
#: timing of it would cost that many times the baseline's (bf16 autocast on a CPU without bf16
#: kernels runs about 20x slower a step; checkpointing a small model recomputes a cheap forward).
SLOW_STEP_RATIO = 3.0


def slow_verdict(name: str, how: str, step_ratio: float, batch_size: int) -> str:
    """The one line a row clearly slower than the baseline is reported with."""
    why = ""
    if "bfloat16" in how:
        why = ": a device without bfloat16 kernels runs autocast bfloat16 so"
    elif "checkpointing" in how:
        why = ": recomputing the forward costs more than this model gains"
    return (
        f"{how} runs {step_ratio:.1f}x slower a step than the baseline at batch_size {batch_size}{why}; "
        f"not searched (time_slow=True, --time-slow, measures it)"
    )


def mixed_precision_of(parts: tuple[str, ...]) -> str | None:
    """The mixed precision a setting names (one of ``MIXED_PRECISION``), or None."""
    return next((part for part in parts if part in MIXED_PRECISION), None)


@dataclass(frozen=True)
class Facts:
    """What decides whether a technique applies to a workload on a device."""

    cuda: bool
    custom_train_step: bool  # the workload's own train_step: batchfit cannot add autocast inside it
    repeated_block: str | None  # the module type checkpointing wraps, None when none repeats
    global_batch_size: int | None = None
    bfloat16: bool = True  # the device runs bfloat16 (the CPU and GPUs from Ampere on)
    closure_optimizer: bool = False  # the optimizer's step needs a closure (L-BFGS)
    compiled: tuple[str, ...] = ()  # what of the workload runs torch.compile'd code already
    compiler: str | None = None  # why torch.compile cannot run on this device, None where it can
    expandable_segments: bool = False  # CUDA's allocator makes expandable segments already


def parse_settings(names: Sequence[str]) -> list[tuple[str, ...]]:
    """Each setting's techniques (``()`` for the baseline, which always comes first, once)."""
    settings: list[tuple[str, ...]] = [()]
    for name in names:
        name = name.strip()
        if name in ("", BASELINE):
            continue
        if name == ACCUMULATION:
            parts: tuple[str, ...] = (ACCUMULATION,)
        else:
            parts = tuple(part.strip() for part in name.split("+"))
            unknown = [part for part in parts if part not in TECHNIQUES]
            if unknown:
                raise ConfigurationError(
                    f"technique {name!r}: {', '.join(repr(part) for part in unknown)} is not one of "
                    f"{', '.join(TECHNIQUES)} (combined with '+', e.g. amp+checkpointing), {BASELINE} or "
                    f"{ACCUMULATION}."
                )
            if {"cudnn-benchmark-on", "cudnn-benchmark-off"} <= set(parts):
                raise ConfigurationError(f"technique {name!r} turns cuDNN's benchmark both on and off.")
            if len(set(parts) & set(MIXED_PRECISION)) > 1:
                raise ConfigurationError(
                    f"technique {name!r} names mixed precision twice: choose one of amp (the device's "
                    "usual dtype), amp-fp16 (float16 with a GradScaler) or amp-bf16."
                )
        if parts not in settings:
            settings.append(parts)
    return settings


def setting_name(parts: tuple[str, ...]) -> str:
    return "+".join(parts) if parts else BASELINE


def default_settings(facts: Facts, cudnn_benchmark: bool) -> list[tuple[str, ...]]:
    """The baseline, mixed precision, checkpointing and both; on CUDA cuDNN's auto-tuner flipped
    from the baseline's, and expandable segments where the allocator does not make them already;
    accumulation when a global batch is asked for."""
    names = ["amp", "checkpointing", "amp+checkpointing"]
    if facts.cuda:
        names.append("cudnn-benchmark-off" if cudnn_benchmark else "cudnn-benchmark-on")
        if not facts.expandable_segments:
            names.append(EXPANDABLE_SEGMENTS)
    if facts.global_batch_size is not None:
        names.append(ACCUMULATION)
    return parse_settings(names)


def why_not(parts: tuple[str, ...], facts: Facts) -> str | None:
    """Why the setting cannot apply to this workload here, or None when it can."""
    reasons = []
    amp = mixed_precision_of(parts)
    if amp is not None and facts.custom_train_step:
        reasons.append(
            f"{amp}: the workload has its own train_step, which batchfit cannot wrap in autocast (add "
            "autocast and a GradScaler to the train_step and compare it as the baseline)"
        )
    if amp == "amp-bf16" and not facts.bfloat16:
        reasons.append("amp-bf16: this GPU does not run bfloat16 (amp-fp16 does, with a GradScaler)")
    if facts.closure_optimizer and (amp == "amp-fp16" or (amp == "amp" and not facts.bfloat16)):
        reasons.append(
            f"{amp}: float16 steps the optimizer through a GradScaler, which cannot step one that needs "
            "a closure (L-BFGS)" + ("; amp-bf16 can" if facts.bfloat16 else "")
        )
    if "checkpointing" in parts and facts.repeated_block is None:
        reasons.append(
            "checkpointing: the model has no repeated block (no module type with parameters and "
            "children occurs twice); name one with checkpoint_module"
        )
    if COMPILE in parts and facts.compiled:
        reasons.append(
            f"compile: the workload runs compiled code already ({', '.join(facts.compiled)}), so its "
            "baseline is the compiled one; compare the eager model to see what compile buys"
        )
    elif COMPILE in parts and facts.compiler is not None:
        reasons.append(f"compile: {facts.compiler}")
    if any(part.startswith("cudnn-benchmark") for part in parts) and not facts.cuda:
        reasons.append("cuDNN's benchmark needs CUDA")
    if EXPANDABLE_SEGMENTS in parts and not facts.cuda:
        reasons.append("expandable segments are CUDA's caching allocator's (PYTORCH_CUDA_ALLOC_CONF)")
    elif EXPANDABLE_SEGMENTS in parts and facts.expandable_segments:
        reasons.append(
            "expandable segments: the allocator makes them already (PYTORCH_CUDA_ALLOC_CONF), so the "
            "baseline has them"
        )
    if ACCUMULATION in parts and facts.global_batch_size is None:
        reasons.append("accumulation needs global_batch_size, the global batch to reach")
    if ACCUMULATION in parts and facts.custom_train_step:
        reasons.append(
            "accumulation: the workload's own train_step steps the optimizer, which batchfit cannot "
            "defer to every n-th micro-batch"
        )
    return "; ".join(reasons) or None


def repeated_block(modules: Sequence[tuple[str, bool]]) -> str | None:
    """The type name checkpointing wraps: among ``(type name, is a block)`` pairs, one per module
    (a block has parameters and children), the most frequent block type that occurs twice or more;
    the first seen wins a tie."""
    counts: dict[str, int] = {}
    for name, block in modules:
        if block:
            counts[name] = counts.get(name, 0) + 1
    repeated = [(count, -index, name) for index, (name, count) in enumerate(counts.items()) if count >= 2]
    return max(repeated)[2] if repeated else None
