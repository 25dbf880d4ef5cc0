"""YAML experiment configs: the seed's AutoBatch section, overrides, interpolation, and every bad config."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from batchfit.analysis.apply_autobatch import sizes_from_config, trials_from_config, where_from_config
from batchfit.analysis.config import (
    ALIASES,
    SEARCH_KEYS,
    AutobatchConfig,
    DataConfig,
    ExperimentConfig,
    config_to_dict,
    load_config,
    save_config,
)
from batchfit.errors import ConfigurationError
from batchfit.options import BatchSizes, Trials, Where

# The seed's "Configuration" section, word for word, indented as YAML.
SEED_CONFIG = """\
DATA:
  AUTOBATCH:
    ENABLED: False # Run the search for the training batch size
    TARGET_MEMORY_FRACTION: 0.8 # Fraction of GPU memory to use
    MAX_BATCH_SIZE: 512 # Upper bound for the search
    MIN_BATCH_SIZE: 1 # Lower bound
    STEPS_PER_TRIAL: 2 # Steps to simulate per trial
    LOG_LEVEL: "INFO" # Logging level for the autobatch logger
    ENABLED_VAL: ${DATA.AUTOBATCH.ENABLED} # Also search validation size
    TARGET_MEMORY_FRACTION_VAL: ${DATA.AUTOBATCH.TARGET_MEMORY_FRACTION}
    MAX_BATCH_SIZE_VAL: ${DATA.AUTOBATCH.MAX_BATCH_SIZE} * 2
    MIN_BATCH_SIZE_VAL: ${DATA.AUTOBATCH.MIN_BATCH_SIZE}
    STEPS_PER_TRIAL_VAL: ${DATA.AUTOBATCH.STEPS_PER_TRIAL}
    LOG_LEVEL_VAL: ${DATA.AUTOBATCH.LOG_LEVEL}
"""

# The seed's "Configure Discovered Batch Sizes" snippet.
SEED_DISCOVERED = """\
DATA:
  BATCH_SIZE: 64 # Use discovered training batch size
  BATCH_SIZE_VAL: 128 # Use discovered validation batch size
  AUTOBATCH:
    ENABLED: False # Disable autobatch for multi-GPU run
    ENABLED_VAL: False
"""

AUTO = "DATA.AUTOBATCH"
TRAIN_KEYS = ["ENABLED", "MEMORY_FRACTION", "MIN_BATCH_SIZE", "STEPS_PER_TRIAL", "LOG_LEVEL"]


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def fails(message: str) -> Any:
    """Expect a ConfigurationError whose whole message is ``message``."""
    return pytest.raises(ConfigurationError, match=f"^{re.escape(message)}$")


def test_seed_config_section_loads_and_interpolates(tmp_path: Path) -> None:
    auto = load_config(write(tmp_path, SEED_CONFIG)).DATA.AUTOBATCH
    expected = dict(
        ENABLED=False,
        MEMORY_FRACTION=0.8,  # the seed's TARGET_MEMORY_FRACTION
        MAX_BATCH_SIZE=512,
        MIN_BATCH_SIZE=1,
        STEPS_PER_TRIAL=2,
        LOG_LEVEL="INFO",
        ENABLED_VAL=False,
        MEMORY_FRACTION_VAL=0.8,
        MAX_BATCH_SIZE_VAL=1024,
        MIN_BATCH_SIZE_VAL=1,
        STEPS_PER_TRIAL_VAL=2,
        LOG_LEVEL_VAL="INFO",
    )
    assert {key: getattr(auto, key) for key in expected} == expected
    assert auto == AutobatchConfig(**{**dataclasses.asdict(load_config(None).DATA.AUTOBATCH), **expected})
    for key in TRAIN_KEYS:
        assert getattr(auto, f"{key}_VAL") == getattr(auto, key)
        assert type(getattr(auto, f"{key}_VAL")) is type(getattr(auto, key))
    assert type(auto.MAX_BATCH_SIZE_VAL) is int


@pytest.mark.parametrize("text", [SEED_CONFIG, ""], ids=["seed", "defaults"])
def test_val_keys_follow_overrides_of_the_train_keys(tmp_path: Path, text: str) -> None:
    overrides = [
        "DATA.AUTOBATCH.MAX_BATCH_SIZE", "100",
        "DATA.AUTOBATCH.ENABLED", "True",
        "DATA.AUTOBATCH.TARGET_MEMORY_FRACTION", "0.85",
        "DATA.AUTOBATCH.MIN_BATCH_SIZE", "4",
        "DATA.AUTOBATCH.STEPS_PER_TRIAL", "3",
        "DATA.AUTOBATCH.LOG_LEVEL", "DEBUG",
    ]  # fmt: skip
    auto = load_config(write(tmp_path, text), overrides).DATA.AUTOBATCH
    assert auto.MAX_BATCH_SIZE == 100
    assert auto.MAX_BATCH_SIZE_VAL == 200
    assert (auto.ENABLED_VAL, auto.MEMORY_FRACTION_VAL) == (True, 0.85)
    assert (auto.MIN_BATCH_SIZE_VAL, auto.STEPS_PER_TRIAL_VAL, auto.LOG_LEVEL_VAL) == (4, 3, "DEBUG")


def test_seed_discovered_batch_sizes_snippet_loads(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, SEED_DISCOVERED))
    assert (cfg.DATA.BATCH_SIZE, cfg.DATA.BATCH_SIZE_VAL) == (64, 128)
    assert (cfg.DATA.AUTOBATCH.ENABLED, cfg.DATA.AUTOBATCH.ENABLED_VAL) == (False, False)
    assert cfg.DATA.AUTOBATCH.MAX_BATCH_SIZE_VAL == 1024


def test_defaults_need_no_file_and_equal_an_empty_one(tmp_path: Path) -> None:
    cfg = load_config(None)
    assert cfg == load_config(write(tmp_path, "")) == load_config(write(tmp_path, "DATA:\n  AUTOBATCH:\n"))
    assert (cfg.WORKLOAD, cfg.DEVICE, cfg.MEMORY_LIMIT) == ("example:mlp", None, None)
    assert (cfg.DATA.BATCH_SIZE, cfg.DATA.BATCH_SIZE_VAL) == (32, 64)
    assert cfg.DATA.AUTOBATCH.MAX_BATCH_SIZE_VAL == 1024


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("DATA.AUTOBATCH.ENABLED", "True", True),
        ("DATA.AUTOBATCH.ENABLED", "true", True),
        ("DATA.AUTOBATCH.ENABLED", "False", False),
        ("DATA.AUTOBATCH.ENABLED_VAL", "True", True),
        ("DATA.AUTOBATCH.TARGET_MEMORY_FRACTION", "0.85", 0.85),
        ("DATA.AUTOBATCH.TARGET_MEMORY_FRACTION", "1", 1.0),
        ("DATA.AUTOBATCH.TARGET_MEMORY_FRACTION_VAL", "0.5", 0.5),
        ("DATA.AUTOBATCH.MAX_BATCH_SIZE_VAL", "300", 300),
        ("DATA.AUTOBATCH.LOG_LEVEL", "warning", "WARNING"),
        ("DATA.BATCH_SIZE", "16", 16),
        ("WORKLOAD", "example:transformer", "example:transformer"),
        ("WORKLOAD", "my_pkg.train:workload", "my_pkg.train:workload"),
        ("DEVICE", "cuda:1", "cuda:1"),
        ("DEVICE", "null", None),
        ("MEMORY_LIMIT", "2GiB", "2GiB"),
        ("MEMORY_LIMIT", "None", None),
    ],
)
def test_overrides_are_typed_by_the_schema(tmp_path: Path, key: str, value: str, expected: object) -> None:
    text = "DEVICE: cpu\nMEMORY_LIMIT: 1GiB\n"
    values = config_to_dict(load_config(write(tmp_path, text), [key, value]))
    for part in ALIASES.get(key, key).split("."):  # the seed's name read as its field's key
        values = values[part]
    assert values == expected
    assert type(values) is type(expected)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("DATA.AUTOBATCH.MAX_BATCH_SIZE_VAL", "(1 + 3) * 8", 32),
        ("DATA.AUTOBATCH.MAX_BATCH_SIZE_VAL", "1024 // 3", 341),
        ("DATA.AUTOBATCH.MAX_BATCH_SIZE_VAL", "1024 / 2", 512),
        ("DATA.AUTOBATCH.MAX_BATCH_SIZE_VAL", "-2 + ${DATA.AUTOBATCH.MAX_BATCH_SIZE} - 10", 500),
        ("DATA.AUTOBATCH.TARGET_MEMORY_FRACTION_VAL", "${DATA.AUTOBATCH.TARGET_MEMORY_FRACTION} / 2", 0.4),
        ("DATA.BATCH_SIZE_VAL", "${DATA.BATCH_SIZE} * 4", 128),
    ],
)
def test_arithmetic_in_numeric_values(key: str, value: str, expected: object) -> None:
    values = config_to_dict(load_config(None, [key, value]))
    for part in ALIASES.get(key, key).split("."):  # the seed's name read as its field's key
        values = values[part]
    assert values == expected
    assert type(values) is type(expected)


def test_an_interpolated_expression_keeps_its_precedence(tmp_path: Path) -> None:
    # MAX_BATCH_SIZE_VAL is "${DATA.AUTOBATCH.MAX_BATCH_SIZE} * 2": (256 + 256) * 2, not 256 + 256 * 2.
    cfg = load_config(write(tmp_path, SEED_CONFIG), ["DATA.AUTOBATCH.MAX_BATCH_SIZE", "256 + 256"])
    assert (cfg.DATA.AUTOBATCH.MAX_BATCH_SIZE, cfg.DATA.AUTOBATCH.MAX_BATCH_SIZE_VAL) == (512, 1024)


def test_odd_number_of_override_words_is_an_error() -> None:
    with fails(
        "overrides come in KEY VALUE pairs, got an odd number of words (3): 'DATA.BATCH_SIZE' has no value; "
        "write e.g. DATA.AUTOBATCH.ENABLED True."
    ):
        load_config(None, ["DATA.AUTOBATCH.ENABLED", "True", "DATA.BATCH_SIZE"])


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            f"{AUTO}.ENABLE",
            "True",
            (
                f"unknown key {AUTO}.ENABLE (value 'True') in the overrides; "
                f"did you mean {AUTO}.ENABLED or {AUTO}.ENABLED_VAL?"
            ),
        ),
        (
            "data.batch_size",
            "8",
            (
                "unknown key data.batch_size (value '8') in the overrides; "
                "did you mean DATA.BATCH_SIZE or DATA.BATCH_SIZE_VAL?"
            ),
        ),
        (
            f"{AUTO}.TARGET_FRACTION",
            "0.5",
            (
                f"unknown key {AUTO}.TARGET_FRACTION (value '0.5') in the overrides; "
                f"did you mean {AUTO}.TARGET_MEMORY_FRACTION, {AUTO}.TARGET_MEMORY_FRACTION_VAL or "
                f"{AUTO}.MEMORY_FRACTION?"
            ),
        ),
        (
            "FOO",
            "1",
            (
                "unknown key FOO (value '1') in the overrides; "
                "valid keys are WORKLOAD, DEVICE, MEMORY_LIMIT, DATA."
            ),
        ),
        (
            "DATA.SHUFFLE",
            "True",
            (
                "unknown key DATA.SHUFFLE (value 'True') in the overrides; "
                "valid keys are DATA.BATCH_SIZE, DATA.BATCH_SIZE_VAL, DATA.AUTOBATCH."
            ),
        ),
        (
            AUTO,
            "True",
            (
                f"{AUTO} is a section, not a value (got 'True') in the overrides; "
                f"set keys in it, e.g. {AUTO}.ENABLED."
            ),
        ),
    ],
)
def test_unknown_override_keys_name_the_nearest_valid_keys(key: str, value: str, message: str) -> None:
    with fails(message):
        load_config(None, [key, value])


def test_unknown_key_in_the_file_names_file_value_and_nearest_key(tmp_path: Path) -> None:
    path = write(tmp_path, "DATA:\n  AUTOBATCH:\n    ENABLE: True\n")
    with fails(
        f"unknown key {AUTO}.ENABLE (value True) in config file '{path}'; "
        f"did you mean {AUTO}.ENABLED or {AUTO}.ENABLED_VAL?"
    ):
        load_config(path)


def test_unknown_key_with_no_near_match_lists_its_section(tmp_path: Path) -> None:
    path = write(tmp_path, "DATA:\n  AUTOBATCH:\n    XYZZY: 3\n")
    keys = ", ".join(f"{AUTO}.{name}" for name in AutobatchConfig.__dataclass_fields__)
    with fails(f"unknown key {AUTO}.XYZZY (value 3) in config file '{path}'; valid keys are {keys}."):
        load_config(path)


BOOL = "a bool (True or False)"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (f"{AUTO}.MAX_BATCH_SIZE", "lots", f"{AUTO}.MAX_BATCH_SIZE must be an int, got 'lots'."),
        (f"{AUTO}.MAX_BATCH_SIZE", "64.5", f"{AUTO}.MAX_BATCH_SIZE must be an int, got '64.5'."),
        (f"{AUTO}.ENABLED", "5", f"{AUTO}.ENABLED must be {BOOL}, got '5'."),
        (f"{AUTO}.ENABLED", "maybe", f"{AUTO}.ENABLED must be {BOOL}, got 'maybe'."),
        (
            f"{AUTO}.TARGET_MEMORY_FRACTION",
            "high",
            f"{AUTO}.MEMORY_FRACTION (TARGET_MEMORY_FRACTION) must be a float, got 'high'.",
        ),
        ("DATA.BATCH_SIZE", "null", "DATA.BATCH_SIZE must be an int, got None."),
        (
            f"{AUTO}.MAX_BATCH_SIZE_VAL",
            "7 / 2",
            f"{AUTO}.MAX_BATCH_SIZE_VAL must be an int, got 3.5 (from '7 / 2').",
        ),
        (
            f"{AUTO}.MAX_BATCH_SIZE_VAL",
            "${DATA.AUTOBATCH.LOG_LEVEL}",
            f"{AUTO}.MAX_BATCH_SIZE_VAL must be an int, got 'INFO' (from '${{DATA.AUTOBATCH.LOG_LEVEL}}').",
        ),
    ],
)
def test_wrong_types_name_the_key_and_value(key: str, value: str, message: str) -> None:
    with fails(message):
        load_config(None, [key, value])


def test_wrong_type_in_the_file(tmp_path: Path) -> None:
    with fails(f"{AUTO}.MAX_BATCH_SIZE must be an int, got 512.5."):
        load_config(write(tmp_path, "DATA:\n  AUTOBATCH:\n    MAX_BATCH_SIZE: 512.5\n"))
    with fails(f"{AUTO}.ENABLED must be {BOOL}, got 1."):
        load_config(write(tmp_path, "DATA:\n  AUTOBATCH:\n    ENABLED: 1\n"))
    with fails("DATA.BATCH_SIZE must be an int, got [1, 2]."):
        load_config(write(tmp_path, "DATA:\n  BATCH_SIZE: [1, 2]\n"))


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    with fails(
        f"config file '{path}' does not exist; pass the path of a YAML file (relative to {Path.cwd()})."
    ):
        load_config(path)
    with fails(
        f"config file '{tmp_path}' is a directory; pass the path of a YAML file (relative to {Path.cwd()})."
    ):
        load_config(tmp_path)


def test_yaml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "DATA:\n  BATCH_SIZE: 64\n  AUTOBATCH: [1, 2\n")
    where = re.escape(f"config file '{path}' is not valid YAML at line 4, column 1: ")
    with pytest.raises(ConfigurationError, match=f"^{where}.*',' or ']'.*; fix it there\\.$"):
        load_config(path)  # the problem's wording is PyYAML's and varies between its versions
    path = write(tmp_path, "DATA:\n  BATCH_SIZE: 64\n  BATCH_SIZE: 32\n")
    with fails(
        f"config file '{path}' is not valid YAML at line 3, column 3: found duplicate key BATCH_SIZE; "
        "fix it there."
    ):
        load_config(path)


def test_file_must_hold_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "- DATA\n- 1\n")
    with fails(f"config file '{path}' must hold a mapping of keys (such as DATA:), not a list."):
        load_config(path)
    path = write(tmp_path, "DATA: 64\n")
    with fails(
        f"DATA is a section, not a value (got 64) in config file '{path}'; "
        "set keys in it, e.g. DATA.BATCH_SIZE."
    ):
        load_config(path)


FRACTION = "it is the fraction of device memory a batch may use, e.g. 0.8."
MIN_MAX = "lower the first or raise the second."
LEVELS = "a logging level name (DEBUG, INFO, WARNING, ERROR or CRITICAL)"
BUILTINS = "example:cnn, example:mlp, example:transformer"
FORMS = f"'example:NAME' for a built-in ({BUILTINS}) or 'module:function' naming a function that returns"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            f"{AUTO}.TARGET_MEMORY_FRACTION",
            "1.5",
            f"{AUTO}.MEMORY_FRACTION (TARGET_MEMORY_FRACTION) must be in (0, 1], got 1.5: {FRACTION}",
        ),
        (
            f"{AUTO}.TARGET_MEMORY_FRACTION",
            "0",
            f"{AUTO}.MEMORY_FRACTION (TARGET_MEMORY_FRACTION) must be in (0, 1], got 0.0: {FRACTION}",
        ),
        (
            f"{AUTO}.TARGET_MEMORY_FRACTION_VAL",
            "1.01",
            (
                f"{AUTO}.MEMORY_FRACTION_VAL (TARGET_MEMORY_FRACTION_VAL) must be in (0, 1], got 1.01: "
                f"{FRACTION}"
            ),
        ),
        (
            f"{AUTO}.MIN_BATCH_SIZE",
            "600",
            f"{AUTO}.MIN_BATCH_SIZE (600) is above {AUTO}.MAX_BATCH_SIZE (512): {MIN_MAX}",
        ),
        (
            f"{AUTO}.MIN_BATCH_SIZE_VAL",
            "2000",
            f"{AUTO}.MIN_BATCH_SIZE_VAL (2000) is above {AUTO}.MAX_BATCH_SIZE_VAL (1024): {MIN_MAX}",
        ),
        (f"{AUTO}.MIN_BATCH_SIZE", "0", f"{AUTO}.MIN_BATCH_SIZE must be at least 1, got 0."),
        (f"{AUTO}.MAX_BATCH_SIZE", "-4", f"{AUTO}.MAX_BATCH_SIZE must be at least 1, got -4."),
        (f"{AUTO}.STEPS_PER_TRIAL", "0", f"{AUTO}.STEPS_PER_TRIAL must be at least 1, got 0."),
        (f"{AUTO}.STEPS_PER_TRIAL_VAL", "0", f"{AUTO}.STEPS_PER_TRIAL_VAL must be at least 1, got 0."),
        ("DATA.BATCH_SIZE", "0", "DATA.BATCH_SIZE must be at least 1, got 0."),
        ("DATA.BATCH_SIZE_VAL", "-1", "DATA.BATCH_SIZE_VAL must be at least 1, got -1."),
        (f"{AUTO}.LOG_LEVEL", "verbose", f"{AUTO}.LOG_LEVEL must be {LEVELS}, got 'verbose'."),
        (f"{AUTO}.LOG_LEVEL_VAL", "loud", f"{AUTO}.LOG_LEVEL_VAL must be {LEVELS}, got 'loud'."),
        (
            "WORKLOAD",
            "example:resnet",
            f"WORKLOAD 'example:resnet' is not a built-in example; the built-ins are {BUILTINS}.",
        ),
        ("WORKLOAD", "resnet", f"WORKLOAD must be {FORMS} a batchfit.Workload, got 'resnet'."),
        (
            "WORKLOAD",
            "my-train.py:fn",
            f"WORKLOAD must be {FORMS} a batchfit.Workload, got 'my-train.py:fn'.",
        ),
        (
            "MEMORY_LIMIT",
            "lots",
            (
                "MEMORY_LIMIT='lots' is not a size: write a number and a unit, such as '2GiB' (2 x 1024^3 "
                "bytes), '1.5GB' (1.5 x 1000^3), '800MiB' or '1000000' (bytes)."
            ),
        ),
        ("DEVICE", "gpu", "DEVICE must be cpu, cuda or cuda:N (or null: cuda if available), got 'gpu'."),
        (
            f"{AUTO}.MAX_BATCH_SIZE_VAL",
            "${DATA.AUTOBATCH.MAX} * 2",
            (
                f"{AUTO}.MAX_BATCH_SIZE_VAL = '${{DATA.AUTOBATCH.MAX}} * 2' cannot be resolved: "
                "Interpolation key 'DATA.AUTOBATCH.MAX' not found."
            ),
        ),
    ],
)
def test_bad_values_give_one_message_naming_key_and_value(key: str, value: str, message: str) -> None:
    with fails(message):
        load_config(None, [key, value])


def test_bad_values_in_the_file_are_caught_too(tmp_path: Path) -> None:
    with fails(f"{AUTO}.MEMORY_FRACTION (TARGET_MEMORY_FRACTION) must be in (0, 1], got 1.5: {FRACTION}"):
        load_config(write(tmp_path, SEED_CONFIG.replace("FRACTION: 0.8", "FRACTION: 1.5")))
    with fails(f"{AUTO}.MIN_BATCH_SIZE (600) is above {AUTO}.MAX_BATCH_SIZE (512): {MIN_MAX}"):
        load_config(write(tmp_path, SEED_CONFIG.replace("MIN_BATCH_SIZE: 1", "MIN_BATCH_SIZE: 600")))
    with fails(f"WORKLOAD 'example:resnet' is not a built-in example; the built-ins are {BUILTINS}."):
        load_config(write(tmp_path, "WORKLOAD: example:resnet\n"))


def test_configuration_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match=r"^DATA\.BATCH_SIZE must be at least 1, got 0\.$"):
        load_config(None, ["DATA.BATCH_SIZE", "0"])


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    overrides = ["DEVICE", "cpu", "MEMORY_LIMIT", "2GiB", "WORKLOAD", "example:cnn", "DATA.BATCH_SIZE", "48"]
    overrides += [f"{AUTO}.ENABLED", "True", f"{AUTO}.TARGET_MEMORY_FRACTION", "0.85"]
    cfg = load_config(write(tmp_path, SEED_CONFIG), overrides)
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == cfg
    assert "MAX_BATCH_SIZE_VAL: 1024\n" in (tmp_path / "saved.yaml").read_text()
    assert cfg == ExperimentConfig(
        WORKLOAD="example:cnn",
        DEVICE="cpu",
        MEMORY_LIMIT="2GiB",
        DATA=DataConfig(
            BATCH_SIZE=48,
            BATCH_SIZE_VAL=64,
            AUTOBATCH=AutobatchConfig(
                **{
                    **config_to_dict(load_config(None))["DATA"]["AUTOBATCH"],  # the keys not set here
                    "ENABLED": True,
                    "MEMORY_FRACTION": 0.85,
                    "ENABLED_VAL": True,
                    "MEMORY_FRACTION_VAL": 0.85,
                    "MAX_BATCH_SIZE_VAL": 1024,
                    "MIN_BATCH_SIZE_VAL": 1,
                    "STEPS_PER_TRIAL_VAL": 2,
                    "LOG_LEVEL_VAL": "INFO",
                }
            ),
        ),
    )


def test_config_to_dict_is_keyed_as_the_yaml() -> None:
    values = config_to_dict(load_config(None))
    assert list(values) == ["WORKLOAD", "DEVICE", "MEMORY_LIMIT", "DATA"]
    assert list(values["DATA"]) == ["BATCH_SIZE", "BATCH_SIZE_VAL", "AUTOBATCH"]
    assert values["DATA"]["AUTOBATCH"]["MAX_BATCH_SIZE_VAL"] == 1024


def test_every_search_key_sets_an_options_field_and_has_its_eval_twin() -> None:
    keys = {key.name for key in dataclasses.fields(AutobatchConfig)}
    for key, (kind, name) in SEARCH_KEYS.items():
        assert name in {field.name for field in dataclasses.fields(kind) if field.init}, key
    switches = {"ENABLED", "ENABLED_VAL", "LOG_LEVEL", "LOG_LEVEL_VAL"}
    assert keys - switches == set(SEARCH_KEYS) | {f"{key}_VAL" for key in SEARCH_KEYS}


def test_the_options_of_each_mode_s_search_are_its_keys() -> None:
    overrides = [f"{AUTO}.MIN_BATCH_SIZE_VAL", "3", f"{AUTO}.MAX_BATCH_SIZE_VAL", "40"]
    overrides += [f"{AUTO}.STEPS_PER_TRIAL_VAL", "4", f"{AUTO}.TARGET_MEMORY_FRACTION_VAL", "0.5"]
    cfg = load_config(None, ["DEVICE", "cpu", "MEMORY_LIMIT", "64MiB", *overrides])
    assert where_from_config(cfg, "eval") == Where("cpu", "64MiB", 0.5)
    assert sizes_from_config(cfg.DATA.AUTOBATCH, "eval") == BatchSizes(3, 40)
    assert trials_from_config(cfg.DATA.AUTOBATCH, "eval") == Trials(4)
    assert where_from_config(cfg, "train") == Where("cpu", "64MiB", 0.8)
    assert sizes_from_config(cfg.DATA.AUTOBATCH, "train") == BatchSizes(1, 512)


def test_every_options_field_has_a_generated_key_and_every_alias_names_one() -> None:
    top = {"DEVICE": "device", "MEMORY_LIMIT": "memory_limit"}
    assert {field.name for field in dataclasses.fields(ExperimentConfig)} >= set(top)
    keys = {key.name for key in dataclasses.fields(AutobatchConfig)}
    for kind in (Where, BatchSizes, Trials):
        for field in dataclasses.fields(kind):
            if not field.init:
                continue
            if field.name in top.values():  # one device for both searches: the top level's
                continue
            key = field.name.upper()
            assert SEARCH_KEYS[key] == (kind, field.name) and {key, f"{key}_VAL"} <= keys, field.name
    for alias, key in ALIASES.items():
        assert alias.startswith(f"{AUTO}.") and key.removeprefix(f"{AUTO}.") in keys, alias
        assert key.removeprefix(f"{AUTO}.").removesuffix("_VAL") in SEARCH_KEYS, alias


SEED_NAMES = f"""DEVICE: cpu
MEMORY_LIMIT: 64MiB
DATA:
  AUTOBATCH:
    TARGET_MEMORY_FRACTION: 0.7
    MIN_BATCH_SIZE: 2
    MAX_BATCH_SIZE: 96
    STEPS_PER_TRIAL: 3
    TARGET_MEMORY_FRACTION_VAL: ${{{AUTO}.TARGET_MEMORY_FRACTION}} / 2
    MAX_BATCH_SIZE_VAL: ${{{AUTO}.MAX_BATCH_SIZE}} * 3
"""


def test_a_config_in_the_seed_s_names_and_one_in_the_fields_give_the_same_options(tmp_path: Path) -> None:
    fields = SEED_NAMES.replace("TARGET_MEMORY_FRACTION", "MEMORY_FRACTION")
    assert "TARGET" not in fields
    seed, named = load_config(write(tmp_path, SEED_NAMES, "seed.yaml")), load_config(write(tmp_path, fields))
    assert seed == named
    for mode, fraction, upper in (("train", 0.7, 96), ("eval", 0.35, 288)):
        assert where_from_config(seed, mode) == Where("cpu", "64MiB", fraction)
        assert sizes_from_config(seed.DATA.AUTOBATCH, mode) == BatchSizes(2, upper)
        assert trials_from_config(seed.DATA.AUTOBATCH, mode) == Trials(3)
    both = SEED_NAMES + "    MEMORY_FRACTION: 0.6\n"
    path = write(tmp_path, both, "both.yaml")
    with fails(
        f"{AUTO}.MEMORY_FRACTION (TARGET_MEMORY_FRACTION) is given twice in config file '{path}', "
        f"as {AUTO}.MEMORY_FRACTION and as its alias: keep one."
    ):
        load_config(path)


def test_every_field_s_key_reaches_its_options(tmp_path: Path) -> None:
    overrides = [f"{AUTO}.MULTIPLE_OF", "4", f"{AUTO}.MUST_FIT_FROM_VAL", "2", f"{AUTO}.CONFIRM_STEPS", "5"]
    cfg = load_config(None, [*overrides, f"{AUTO}.EVAL_WITH_TRAINING_STATE_VAL", "False"])
    assert sizes_from_config(cfg.DATA.AUTOBATCH, "train") == BatchSizes(1, 512, multiple_of=4)
    assert sizes_from_config(cfg.DATA.AUTOBATCH, "eval") == BatchSizes(1, 1024, 4, must_fit_from=2)
    assert trials_from_config(cfg.DATA.AUTOBATCH, "eval") == Trials(2, 5, eval_with_training_state=False)
