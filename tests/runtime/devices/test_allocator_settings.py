"""The caching allocator's settings as a user makes them: read as torch reads them, with and
without torch's own account (before 2.9), set at run time, and those its model does not have."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _printed(code: str, environment: dict[str, str]) -> list[str]:
    """The lines ``code`` prints in a fresh interpreter (the allocator's settings are the process's)
    with the allocator's environment variables ``environment`` alone."""
    env = {key: value for key, value in os.environ.items() if "ALLOC_CONF" not in key} | environment
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, False),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, True),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, False),
        ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}, True),
        ({"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.6"}, False),
    ],
)
def test_the_allocator_settings_are_read_as_torch_reads_them(
    environment: dict[str, str], expected: bool
) -> None:
    # As a user sets them, on a torch with its own account of its settings and on one without
    # (torch before 2.9, our GPUs' 2.11).
    code = (
        "import torch\n"
        "from batchfit.runtime.devices.allocator_settings import expandable_segments\n"
        "with_getter = expandable_segments()\n"
        "del torch._C._accelerator_getAllocatorSettings\n"
        "print(with_getter, expandable_segments())\n"
    )
    assert _printed(code, environment)[0].split() == [str(expected)] * 2


def test_settings_made_at_run_time_count_where_torch_reports_them() -> None:
    code = (
        "import torch\n"
        "from batchfit.runtime.devices.allocator_settings import allocator_settings, expandable_segments\n"
        "torch.cuda.memory._set_allocator_settings('expandable_segments:True')\n"
        "print(expandable_segments(), allocator_settings())\n"
    )
    assert _printed(code, {}) == ["True {'expandable_segments': 'True'}"]


def test_settings_the_model_does_not_have_are_named_and_a_bracketed_value_is_one() -> None:
    code = (
        "from batchfit.runtime.devices.allocator_settings import allocator_settings, unmodelled_settings\n"
        "print(allocator_settings())\n"
        "print(unmodelled_settings())\n"
    )
    conf = "roundup_power2_divisions:[256:1,512:2],expandable_segments:True"
    assert _printed(code, {"PYTORCH_CUDA_ALLOC_CONF": conf}) == [
        "{'roundup_power2_divisions': '[256:1,512:2]', 'expandable_segments': 'True'}",
        "['roundup_power2_divisions:[256:1,512:2]']",
    ]
    conf = "expandable_segments:True,pinned_use_cuda_host_register:True"  # the host's pinned memory
    assert _printed(code, {"PYTORCH_CUDA_ALLOC_CONF": conf})[1] == "[]"


def test_a_setting_batchfit_makes_keeps_the_ones_the_environment_made() -> None:
    # torch 2.9 on reports only the last string set; its keys change, the rest stay in force.
    code = (
        "import torch\n"
        "from batchfit.runtime.devices.allocator_settings import allocator_settings, set_allocator_settings\n"
        "set_allocator_settings('expandable_segments:True')\n"
        "print(allocator_settings())\n"
        "torch._C._accelerator_setAllocatorSettings('garbage_collection_threshold:0.5')  # someone else's\n"
        "print(allocator_settings())\n"
    )
    assert _printed(code, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}) == [
        "{'max_split_size_mb': '128', 'expandable_segments': 'True'}",
        "{'max_split_size_mb': '128', 'expandable_segments': 'True', 'garbage_collection_threshold': '0.5'}",
    ]
