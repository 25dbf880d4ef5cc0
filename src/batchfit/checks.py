"""The checks, defaults and plain vocabulary every verb and policy shares: positive sizes, ranges,
memory fractions, devices named, the chooser's rules, ``Mode``, ``Objective`` and the ``Candidates``
a search walks, and the upper bounds of a search (eval's is twice train's: an eval step keeps no
activations for backward). Pure: the options objects validate with these, importing no algorithm."""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from batchfit.errors import ArgumentTypeError, ConfigurationError

#: What a step does: train (forward, backward, optimizer step) or eval (forward alone).
Mode = Literal["train", "eval"]
#: What explore recommends: the smallest batch within the tolerance of the fastest, or the fastest.
Objective = Literal["smallest-within-tolerance", "max-throughput"]
#: Samples within this share of the fewest count as as few (the sample-optimal batch's default).
SAMPLE_TOLERANCE = 0.1

#: Upper bound of a training search when none is given (the seed's MAX_BATCH_SIZE).
DEFAULT_MAX_BATCH_SIZE = 512
#: An eval search's default upper bound is this many times the training one.
EVAL_BATCH_FACTOR = 2


def default_max_batch_size(mode: Mode, train_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> int:
    """The upper bound of a ``mode`` search when the user gave ``train_max_batch_size`` for training."""
    return train_max_batch_size * (EVAL_BATCH_FACTOR if mode == "eval" else 1)


def check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    """``value`` when it is an integer (not a bool) of at least ``minimum``; else an error naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigurationError(f"{name} must be {kind}, got {value!r}.")
    return value


def check_positive_number(name: str, value: object, allow_zero: bool = False) -> None:
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    if not (number > 0 or (allow_zero and number == 0)) or math.isinf(number):
        kind = "a non-negative number" if allow_zero else "a positive number"
        raise ConfigurationError(f"{name} must be {kind}, got {value!r}.")


def check_flag(name: str, value: object) -> None:
    """An ArgumentTypeError where ``value`` is not a bool (a string "no" would read as true)."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True or False, got {type_name(value)} ({shown(value)}).")


def check_number(name: str, value: object) -> None:
    """An ArgumentTypeError where ``value`` is not an int or a float (a bool is neither here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"{name} must be a number, got {type_name(value)} ({shown(value)}).")


def check_batch_range(min_batch_size: object, max_batch_size: object) -> None:
    """Both positive integers, the smaller first."""
    low = check_positive_int("min_batch_size", min_batch_size)
    high = check_positive_int("max_batch_size", max_batch_size)
    if low > high:
        raise ConfigurationError(
            f"min_batch_size ({min_batch_size}) is larger than max_batch_size ({max_batch_size}); "
            f"pass min_batch_size <= max_batch_size."
        )


def check_multiple_in_range(min_batch_size: int, max_batch_size: int, multiple_of: int | None) -> None:
    """A multiple of ``multiple_of`` lies in [min_batch_size, max_batch_size]."""
    step = 1 if multiple_of is None else check_positive_int("multiple_of", multiple_of)
    if -(-min_batch_size // step) * step > max_batch_size // step * step:
        raise ConfigurationError(
            f"no multiple of {step} lies in [min_batch_size, max_batch_size] = "
            f"[{min_batch_size}, {max_batch_size}]; widen the range or change multiple_of."
        )


def check_divisible(global_batch_size: int | None, world_size: int) -> None:
    """``global_batch_size`` (when given) splits evenly over ``world_size`` devices."""
    if global_batch_size is not None and global_batch_size % world_size:
        below = global_batch_size // world_size * world_size or world_size
        raise ConfigurationError(
            f"global_batch_size ({global_batch_size}) is not divisible by world_size ({world_size}); "
            f"{below} or {(global_batch_size // world_size + 1) * world_size} would work."
        )


def check_choice_rules(tolerance: float, objective: Objective, confidence_target: int) -> None:
    """The throughput chooser's rules: a tolerance in [0, 1), a known objective, a confidence in [0, 100]."""
    if not 0 <= tolerance < 1:
        raise ConfigurationError(f"tolerance={tolerance!r} must be in [0, 1), e.g. 0.03 for 3%.")
    if objective not in ("smallest-within-tolerance", "max-throughput"):
        raise ConfigurationError(
            f"objective={objective!r}: use 'smallest-within-tolerance' or 'max-throughput'."
        )
    if not 0 <= confidence_target <= 100:
        raise ConfigurationError(f"confidence_target={confidence_target!r} must be in [0, 100].")


def check_noise_scale(noise_scale: object) -> float:
    """``B_noise`` in samples: a positive number given, or a measured ``NoiseScale``'s ``b_simple``;
    else a ConfigurationError."""
    measured = getattr(noise_scale, "b_simple", None) if type(noise_scale).__name__ == "NoiseScale" else None
    value = measured if measured is not None else noise_scale
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(
            f"noise_scale must be a number of samples or a measured NoiseScale, got {noise_scale!r}."
        )
    if not value > 0:  # also NaN
        raise ConfigurationError(
            f"noise_scale must be a positive number of samples (inf: the noise hid the signal), got "
            f"{float(value)}; a measured noise scale of 0 or less says the noise did not show at the "
            "batches measured: measure it at smaller batches."
        )
    return float(value)


#: The device types torch names besides the two batchfit measures: named, they are unsupported,
#: not unknown.
OTHER_TORCH_DEVICES = frozenset(
    {
        *("fpga", "hip", "hpu", "ipu", "lazy", "maia", "meta", "mkldnn", "mps", "mtia", "opencl"),
        *("opengl", "privateuseone", "ve", "vulkan", "xla", "xpu"),
    }
)


def check_device(device: object) -> str:
    """``device`` as torch writes it (``cpu``, ``cuda``, ``cuda:N``), read without torch; a
    ConfigurationError naming what to pass for any other."""
    is_torch_device = type(device).__module__ == "torch" and type(device).__name__ == "device"
    text = str(device) if is_torch_device else device
    shown = text if isinstance(text, str) else device
    parsed = re.fullmatch(r"([a-z_]+)(?::(\d+))?", text) if isinstance(text, str) else None
    kind = parsed.group(1) if parsed else None
    if kind == "meta":
        raise ConfigurationError(
            f"device={shown!r} is not supported: batchfit measures 'cpu' and 'cuda' devices; a "
            f"model built on the meta device is predicted from its shapes with batchfit.predict("
            f"workload, batchfit.Targets(capacities='24GiB'), device='cpu') (batchfit predict "
            f"--device cpu --capacities 24GiB)."
        )
    if kind in OTHER_TORCH_DEVICES:
        raise ConfigurationError(
            f"device={shown!r} is not supported: batchfit measures 'cpu' and 'cuda' devices."
        )
    if kind not in ("cpu", "cuda"):
        raise ConfigurationError(f"device={shown!r} is not a device: use 'cpu', 'cuda' or 'cuda:N'.")
    return str(text)


def check_memory_fraction(memory_fraction: object, name: str = "memory_fraction") -> None:
    if (
        isinstance(memory_fraction, bool)
        or not isinstance(memory_fraction, (int, float))
        or not 0 < memory_fraction <= 1
    ):
        kind = "" if isinstance(memory_fraction, (int, float)) else " a number"
        raise ConfigurationError(
            f"{name}={memory_fraction!r} must be{kind} in (0, 1]: the share of device memory a batch may use."
        )


def exported(kind: type) -> bool:
    """Whether a user imports ``kind`` from ``batchfit`` itself (its ``__all__``), not its module."""
    package = sys.modules.get("batchfit")  # initialised before any of its modules runs a check
    names = getattr(package, "__all__", ())
    return kind.__name__ in names and getattr(package, kind.__name__, None) is kind


def type_name(value: object) -> str:
    """``value``'s type as a user writes it: ``int``, ``torch.nn.Sequential``, ``batchfit.Trials``,
    ``batchfit.policy.search.trial.Trial`` (a type batchfit does not export)."""
    kind = type(value)
    module = kind.__module__
    if module == "builtins":
        return kind.__qualname__
    if module.startswith("batchfit."):
        return f"batchfit.{kind.__qualname__}" if exported(kind) else f"{module}.{kind.__qualname__}"
    for public in ("torch.nn", "torch.optim", "torch.utils.data"):
        if module.startswith(f"{public}."):  # torch.nn.modules.container.Sequential: torch.nn's
            return f"{public}.{kind.__qualname__}"
    return f"{module}.{kind.__qualname__}"


def shown(value: object, width: int = 60) -> str:
    """``repr(value)``, cut to ``width`` characters (a model's or a tensor's runs to pages)."""
    text = repr(value)
    return text if len(text) <= width else f"{text[: width - 3]}..."


def check_type(name: str, value: object, good: bool, expected: str, advice: str) -> None:
    """An ArgumentTypeError unless ``good``: ``name`` must be ``expected``, what it got, and ``advice``
    (what to pass)."""
    if not good:
        raise ArgumentTypeError(
            f"{name} must be {expected}, got {type_name(value)} ({shown(value)}); pass {advice}."
        )


def check_option(owner: str, name: str, value: object, kind: type, *, optional: bool = False) -> None:
    """An ArgumentTypeError where ``owner``'s ``name`` is not a ``kind`` (an options object; with
    ``optional`` None too), saying what was given and what to pass."""
    example = "..."
    if kind.__name__ == "BatchSizes" and isinstance(value, int) and not isinstance(value, bool):
        example = f"max_batch_size={value}"  # a bare number given for the sizes: their bound, likely
    elif kind.__name__ == "Trials" and isinstance(value, int) and not isinstance(value, bool):
        example = f"steps_per_trial={value}"
    none = " (or None)" if optional else ""
    written, imported = f"batchfit.{kind.__name__}", ""
    if not exported(kind):  # an option imported from its module: say from which
        written, imported = kind.__name__, f" (from {kind.__module__} import {kind.__name__})"
    check_type(
        f"{owner}'s {name}",
        value,
        isinstance(value, kind) or (optional and value is None),
        f"a {written}{none}",
        f"{name}={written}({example}){imported}",
    )


def check_callback(label: str, value: object, takes: str) -> None:
    """An ArgumentTypeError where ``label`` (``Workload.loss_fn``, ``find_batch_size's
    on_progress``) is neither None nor callable."""
    if value is not None and not callable(value):
        raise ArgumentTypeError(
            f"{label} must be a function taking {takes}, or None; got {type_name(value)} ({shown(value)})."
        )


def option(default: Any, help: str, *, cli: bool = True) -> Any:
    """An options object's field: its default (``dataclasses.MISSING``: none, the flag is required)
    and the one-line help its flag shows (``cli=False``: no flag)."""
    return field(default=default, metadata={"help": help, "cli": cli})


@dataclass(frozen=True)
class Candidates:
    """The batch sizes allowed: multiples of ``multiple_of`` in [min_batch_size, max_batch_size]."""

    first: int
    step: int
    count: int

    @classmethod
    def between(cls, min_batch_size: int, max_batch_size: int, multiple_of: int | None = None) -> Candidates:
        check_batch_range(min_batch_size, max_batch_size)
        check_multiple_in_range(min_batch_size, max_batch_size, multiple_of)
        step = 1 if multiple_of is None else multiple_of
        first = -(-min_batch_size // step) * step
        last = max_batch_size // step * step
        return cls(first, step, (last - first) // step + 1)

    def batch(self, index: int) -> int:
        return self.first + index * self.step

    def index_at_most(self, batch_size: float) -> int:
        """Index of the largest candidate <= batch_size (-1 if none)."""
        return math.floor((batch_size - self.first) / self.step)
