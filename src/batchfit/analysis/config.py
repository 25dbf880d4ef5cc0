"""YAML experiment configs: loading the schema (``config_schema``: WORKLOAD, DEVICE, DATA.AUTOBATCH...,
generated from the options objects) with command-line overrides, the seed's aliases and
interpolation (by OmegaConf), and validation with messages naming the key."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import logging
import operator
import os
import re
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from batchfit.analysis.config_schema import (
    ALIASES,
    SEARCH_KEYS,
    AutobatchConfig,
    DataConfig,
    ExperimentConfig,
    named,
)
from batchfit.errors import ConfigurationError
from batchfit.units import parse_bytes

__all__ = [
    "SEARCH_KEYS",
    "AutobatchConfig",
    "DataConfig",
    "ExperimentConfig",
    "config_to_dict",
    "load_config",
    "save_config",
]


_KINDS = {bool: "a bool (True or False)", int: "an int", float: "a float", str: "a string"}
_BOOLS = ("true", "false", "yes", "no", "on", "off")  # as YAML reads them, in any case
_NULLS = ("null", "Null", "NULL", "None", "~")
_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}
_INTERPOLATION = re.compile(r"\$\{[^${}]*\}")  # an innermost ${...}
_AUTO = "DATA.AUTOBATCH."


def _leaves(schema: type, prefix: str = "") -> dict[str, type]:
    """Every value key of the schema as a dotted path, with its type (optional ones unwrapped)."""
    found: dict[str, type] = {}
    for name, hint in typing.get_type_hints(schema).items():
        if dataclasses.is_dataclass(hint):
            found.update(_leaves(typing.cast(type, hint), f"{prefix}{name}."))
        else:
            found[prefix + name] = next(a for a in typing.get_args(hint) or (hint,) if a is not type(None))
    return found


_LEAVES = _leaves(ExperimentConfig)
_SECTIONS = {key.rpartition(".")[0] for key in _LEAVES} - {""}


def _evaluate(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        return -_evaluate(node.operand) if isinstance(node.op, ast.USub) else _evaluate(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError(f"not arithmetic on numbers: {ast.dump(node)}")


def _arithmetic(text: str) -> Any:
    """The number ``text`` computes if it is arithmetic (+ - * / // and parentheses on numbers), else None."""
    try:
        return _evaluate(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def _is_expression(text: str) -> bool:
    """Whether ``text`` is arithmetic with an operator once its ``${...}`` interpolations are numbers."""
    while (numbered := _INTERPOLATION.sub("1", text)) != text:
        text = numbered
    return _arithmetic(text) is not None and not re.fullmatch(r"\s*[\d.]+\s*", text)


def _unknown_key(key: str, value: Any, where: str) -> ConfigurationError:
    close = difflib.get_close_matches(key.upper(), [*_LEAVES, *ALIASES], n=3, cutoff=0.8)
    if close:
        hint = f"did you mean {', '.join(close[:-1])}{' or ' if close[:-1] else ''}{close[-1]}?"
    else:  # the keys one level down from the section it is in
        parent = key.rpartition(".")[0]
        start = f"{parent}." if parent in _SECTIONS else ""
        children = dict.fromkeys(
            start + k[len(start) :].split(".")[0] for k in _LEAVES if k.startswith(start)
        )
        hint = f"valid keys are {', '.join(children)}."
    return ConfigurationError(f"unknown key {key} (value {value!r}) in {where}; {hint}")


def _flatten(tree: dict[Any, Any], where: str, prefix: str = "") -> dict[str, Any]:
    """The values by dotted key; unknown keys and values given to whole sections are errors."""
    flat: dict[str, Any] = {}
    for name, value in tree.items():
        key = ALIASES.get(f"{prefix}{name}", f"{prefix}{name}")  # the seed's name: the field's key
        if key in flat:
            raise ConfigurationError(
                f"{named(key)} is given twice in {where}, as {key} and as its alias: keep one."
            )
        if key in _LEAVES:
            flat[key] = _canonical(value)
        elif key not in _SECTIONS:
            raise _unknown_key(key, value, where)
        elif isinstance(value, dict):
            flat.update(_flatten(value, where, f"{key}."))
        elif value is not None:  # an empty section ("DATA:" with nothing under it) is fine
            example = next(k for k in _LEAVES if k.startswith(f"{key}."))
            raise ConfigurationError(
                f"{key} is a section, not a value (got {value!r}) in {where}; set keys in it, e.g. {example}."
            )
    return flat


def _canonical(value: Any) -> Any:
    """``value`` with the aliases its interpolations name (``${DATA.AUTOBATCH.TARGET_MEMORY_FRACTION}``)
    written as the keys they stand for."""
    if not isinstance(value, str):
        return value
    return _INTERPOLATION.sub(lambda found: "${" + ALIASES.get(found[0][2:-1], found[0][2:-1]) + "}", value)


def _read_yaml(path: Path) -> dict[str, Any]:
    where = f"config file '{path}'"
    if not path.is_file():
        problem = "is a directory" if path.is_dir() else "does not exist"
        raise ConfigurationError(
            f"{where} {problem}; pass the path of a YAML file (relative to {os.getcwd()})."
        )
    try:
        tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = error.problem or error.context
        raise ConfigurationError(f"{where} is not valid YAML{at}: {problem}; fix it there.") from error
    except (OSError, UnicodeDecodeError, yaml.YAMLError, OmegaConfBaseException) as error:
        raise ConfigurationError(f"{where} cannot be read: {error}") from error
    if not isinstance(tree, dict):
        raise ConfigurationError(f"{where} must hold a mapping of keys (such as DATA:), not a list.")
    return _flatten(tree, where)


def _parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """``[KEY, VALUE, ...]`` as strings from the command line; the schema types the values later."""
    words = list(overrides)
    if len(words) % 2:
        raise ConfigurationError(
            f"overrides come in KEY VALUE pairs, got an odd number of words ({len(words)}): "
            f"{words[-1]!r} has no value; write e.g. DATA.AUTOBATCH.ENABLED True."
        )
    flat: dict[str, Any] = {}
    for key, value in zip(words[::2], words[1::2], strict=True):
        flat.update(_flatten({key: None if value in _NULLS else value}, "the overrides"))
    return flat


def _resolve(given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every key's value as written and as resolved by OmegaConf (untyped, so "512 * 2" stays text)."""
    try:
        tree = OmegaConf.create(dataclasses.asdict(ExperimentConfig()))
        for key, value in given.items():
            OmegaConf.update(tree, key, value, merge=False)
        raw = _flatten(typing.cast(dict[str, Any], OmegaConf.to_container(tree)), "")
        for key, value in raw.items():  # "(${A} * 2)": an interpolated expression keeps its precedence
            if _LEAVES[key] in (int, float) and isinstance(value, str) and _is_expression(value):
                OmegaConf.update(tree, key, f"({value})", merge=False)
        return raw, _flatten(typing.cast(dict[str, Any], OmegaConf.to_container(tree, resolve=True)), "")
    except OmegaConfBaseException as error:
        key = str(getattr(error, "full_key", ""))
        value = {**_flatten(dataclasses.asdict(ExperimentConfig()), ""), **given}.get(key)
        message = str(error).splitlines()[0]
        raise ConfigurationError(f"{key} = {value!r} cannot be resolved: {message}.") from error


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Read the YAML at ``path`` (None: the defaults alone), apply ``overrides`` (``[KEY, VALUE, ...]``),
    resolve interpolations and arithmetic, and return the validated config with plain typed values."""
    given = {} if path is None else _read_yaml(Path(path))
    raw, resolved = _resolve({**given, **_parse_overrides(overrides)})
    typed = OmegaConf.structured(ExperimentConfig)
    for key, kind in _LEAVES.items():
        value = resolved[key]
        if kind in (int, float) and isinstance(value, str) and _is_expression(value):
            number = _arithmetic(value)
            integral = kind is int and isinstance(number, float) and number.is_integer()
            value = int(number) if integral else number
        try:
            if kind is bool and not (isinstance(value, bool) or str(value).lower() in _BOOLS):
                raise ValueError(value)  # OmegaConf would take 5 or "5" for True
            OmegaConf.update(typed, key, value, merge=False)
        except (ValueError, OmegaConfBaseException) as error:
            origin = f" (from {raw[key]!r})" if raw[key] != value else ""
            raise ConfigurationError(
                f"{named(key)} must be {_KINDS[kind]}, got {value!r}{origin}."
            ) from error
    cfg = typing.cast(ExperimentConfig, OmegaConf.to_object(typed))
    _validate(cfg)
    return cfg


def _validate(cfg: ExperimentConfig) -> None:
    """Check what the types cannot: ranges, MIN against MAX, level names, the forms of the strings."""
    values = _flatten(config_to_dict(cfg), "")
    for name in (key for key, kind in _LEAVES.items() if kind is int):  # batch sizes and steps
        if values[name] is not None and values[name] < 1:
            raise ConfigurationError(f"{name} must be at least 1, got {values[name]}.")
    for suffix in ("", "_VAL"):
        name = f"{_AUTO}MEMORY_FRACTION{suffix}"
        fraction = values[name]
        if not 0 < fraction <= 1:
            raise ConfigurationError(
                f"{named(name)} must be in (0, 1], got {fraction!r}: it is the fraction of device memory "
                f"a batch may use, e.g. 0.8."
            )
        low, high = (f"{_AUTO}{bound}_BATCH_SIZE{suffix}" for bound in ("MIN", "MAX"))
        if values[high] is not None and values[low] > values[high]:
            raise ConfigurationError(
                f"{low} ({values[low]}) is above {high} ({values[high]}): "
                f"lower the first or raise the second."
            )
        level = values[f"{_AUTO}LOG_LEVEL{suffix}"]
        if not isinstance(logging.getLevelName(level.upper()), int):
            raise ConfigurationError(
                f"{_AUTO}LOG_LEVEL{suffix} must be a logging level name "
                f"(DEBUG, INFO, WARNING, ERROR or CRITICAL), got {level!r}."
            )
        setattr(cfg.DATA.AUTOBATCH, f"LOG_LEVEL{suffix}", level.upper())
    from batchfit.runtime.workloads.examples import (
        EXAMPLES,  # here, so that reading a config does not import torch
    )

    module, _, function = cfg.WORKLOAD.partition(":")
    builtins = ", ".join(f"example:{name}" for name in sorted(EXAMPLES))
    if module == "example" and function not in EXAMPLES:
        raise ConfigurationError(
            f"WORKLOAD {cfg.WORKLOAD!r} is not a built-in example; the built-ins are {builtins}."
        )
    if not (all(part.isidentifier() for part in module.split(".")) and function.isidentifier()):
        raise ConfigurationError(
            f"WORKLOAD must be 'example:NAME' for a built-in ({builtins}) or 'module:function' naming "
            f"a function that returns a batchfit.Workload, got {cfg.WORKLOAD!r}."
        )
    if cfg.DEVICE is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", cfg.DEVICE):
        raise ConfigurationError(
            f"DEVICE must be cpu, cuda or cuda:N (or null: cuda if available), got {cfg.DEVICE!r}."
        )
    if cfg.MEMORY_LIMIT is not None:
        parse_bytes(cfg.MEMORY_LIMIT, name="MEMORY_LIMIT")


def config_to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The config as nested plain dicts, keyed as in the YAML."""
    return dataclasses.asdict(cfg)


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    """Write ``cfg`` as YAML that ``load_config`` reads back equal."""
    Path(path).write_text(OmegaConf.to_yaml(OmegaConf.create(config_to_dict(cfg))), encoding="utf-8")
