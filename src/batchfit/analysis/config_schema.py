"""The experiment config's schema, generated from the options objects: ``DEVICE`` and
``MEMORY_LIMIT`` are ``Where``'s fields, ``DATA.AUTOBATCH`` holds every other field of the options a
search takes (``Where.memory_fraction``, ``BatchSizes``, ``Trials``) in capitals, each with its
``_VAL`` twin for the eval search; the seed's names (``TARGET_MEMORY_FRACTION``) are aliases."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from batchfit.checks import DEFAULT_MAX_BATCH_SIZE, EVAL_BATCH_FACTOR
from batchfit.options import BatchSizes, Trials, Where

_AUTO = "DATA.AUTOBATCH."
#: Each mode's keys in DATA.AUTOBATCH: eval's are the _VAL twins.
SUFFIXES = {"train": "", "eval": "_VAL"}
#: The top level's keys, one for every mode: ``Where``'s device and capacity.
TOP_KEYS: dict[str, tuple[type, str]] = {"DEVICE": (Where, "device"), "MEMORY_LIMIT": (Where, "memory_limit")}
#: A config default that is not the field's: the search's upper bound, which the eval twin doubles.
_DEFAULTS: dict[str, Any] = {"MAX_BATCH_SIZE": DEFAULT_MAX_BATCH_SIZE}
_TWIN_OF: dict[str, str] = {"MAX_BATCH_SIZE": f" * {EVAL_BATCH_FACTOR}"}
#: The seed's names for keys the fields name otherwise, accepted as written and read as the field's.
ALIASES: dict[str, str] = {
    f"{_AUTO}TARGET_MEMORY_FRACTION{suffix}": f"{_AUTO}MEMORY_FRACTION{suffix}"
    for suffix in SUFFIXES.values()
}
_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def _search_keys() -> dict[str, tuple[type, str]]:
    """Every field of a search's options that the top level does not set, by its key (its name in
    capitals): the field each of DATA.AUTOBATCH's search keys sets (its _VAL twin: the eval search's)."""
    top = set(TOP_KEYS.values())
    return {
        option.name.upper(): (kind, option.name)
        for kind in (Where, BatchSizes, Trials)
        for option in dataclasses.fields(kind)
        if option.init and (kind, option.name) not in top
    }


#: The options field each of DATA.AUTOBATCH's search keys sets (the eval search's: its _VAL twin).
SEARCH_KEYS = _search_keys()


def _kind(option: dataclasses.Field[Any]) -> tuple[type, bool]:
    """A field's type as the config holds it (its first plain type, ``torch.device`` as a string)
    and whether it may be null."""
    parts = [part.strip() for part in str(option.type).split("|")]
    plain = next((_TYPES[part] for part in parts if part in _TYPES), None)
    if plain is None:
        raise TypeError(f"the config holds no value of {option.name}'s type {option.type}: add it to _TYPES.")
    return plain, "None" in parts


def _autobatch_fields() -> list[tuple[str, Any, Any]]:
    """DATA.AUTOBATCH's keys, typed and defaulted: the switches, the search keys, then each's _VAL
    twin, which follows it unless set."""
    train: list[tuple[str, Any, Any]] = [("ENABLED", bool, False)]
    for key, (kind, name) in SEARCH_KEYS.items():
        option = kind.__dataclass_fields__[name]  # type: ignore[attr-defined]
        plain, nullable = _kind(option)
        train.append((key, plain | None if nullable else plain, _DEFAULTS.get(key, option.default)))
    train.append(("LOG_LEVEL", str, "INFO"))
    twins = [
        (f"{key}_VAL", hint, field(default=f"${{{_AUTO}{key}}}{_TWIN_OF.get(key, '')}"))
        for key, hint, _ in train
    ]
    return [(key, hint, field(default=default)) for key, hint, default in train] + twins


_DOC = """DATA.AUTOBATCH: the batch size search. ENABLED: search the training batch size before
training; LOG_LEVEL: the batchfit logger's level (DEBUG, INFO, WARNING, ERROR, CRITICAL); every other
key is the search's options field of that name in capitals; each _VAL key is its twin for the
validation step."""

if typing.TYPE_CHECKING:

    class AutobatchConfig:
        """DATA.AUTOBATCH, generated from the options' fields (below), so typed loosely here."""

        def __init__(self, **values: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

else:
    AutobatchConfig = dataclasses.make_dataclass(
        "AutobatchConfig", _autobatch_fields(), namespace={"__doc__": _DOC, "__module__": __name__}
    )


@dataclass
class DataConfig:
    """DATA: the batch sizes training uses; a search that runs overwrites them."""

    BATCH_SIZE: int = 32  # training batch size, samples per device per step
    BATCH_SIZE_VAL: int = 64  # validation batch size, samples per device per step
    AUTOBATCH: AutobatchConfig = field(default_factory=AutobatchConfig)


@dataclass
class ExperimentConfig:
    """The whole file. Build it with ``load_config``, which resolves the interpolations."""

    WORKLOAD: str = "example:mlp"  # "example:NAME" (mlp, cnn, transformer) or "module:function"
    DEVICE: str | None = None  # Where.device: cpu, cuda or cuda:N; None: cuda if available, else cpu
    MEMORY_LIMIT: str | None = None  # Where.memory_limit, e.g. "2GiB": caps the device there
    DATA: DataConfig = field(default_factory=DataConfig)


def named(key: str) -> str:
    """``key`` as an error names it: with the seed's alias for it, where it has one."""
    alias = next((alias for alias, canonical in ALIASES.items() if canonical == key), None)
    return key if alias is None else f"{key} ({alias.removeprefix(_AUTO)})"
