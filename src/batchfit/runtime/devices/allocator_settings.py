"""The caching allocator's settings in force (``PYTORCH_CUDA_ALLOC_CONF`` and those set at run time),
read as torch reads them, and set with the account a torch before 2.9 does not keep."""

from __future__ import annotations

import os
import re

import torch

#: Every string ``set_allocator_settings`` set, in order: an account a torch before 2.9 does not keep.
_SET_HERE: list[str] = []


def allocator_settings() -> dict[str, str]:
    """The caching allocator's settings in force (``PYTORCH_CUDA_ALLOC_CONF``'s ``key:value`` pairs,
    or ``torch.cuda.memory._set_allocator_settings``'), keys in lower case: those of the environment
    torch read them from (``PYTORCH_ALLOC_CONF`` before ``PYTORCH_CUDA_ALLOC_CONF``), updated by what
    ``set_allocator_settings`` set since, and by what someone else set last where torch tells
    (2.9 on: its account is the last string set, each setting changing the keys it names)."""
    environment = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    settings = _parsed(environment)
    for made in _SET_HERE:
        settings.update(_parsed(made))
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    last = getter() if getter is not None else ""
    if last and last != (_SET_HERE[-1] if _SET_HERE else environment):
        settings.update(_parsed(last))
    return settings


def set_allocator_settings(text: str) -> None:
    """Set the caching allocator's ``key:value`` settings now (torch's setter: the keys named
    change, the rest stay), and keep the account that a torch before 2.9 does not."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:
        setter = torch.cuda.memory._set_allocator_settings
    setter(text)
    _SET_HERE.append(text)


def _parsed(text: str) -> dict[str, str]:
    # A value may be a bracketed list with commas of its own: roundup_power2_divisions:[256:1,512:2].
    pairs = re.findall(r"([^,:\[\]]+):(\[[^\]]*\]|[^,]*)", text)
    return {key.strip().lower(): value.strip() for key, value in pairs if key.strip()}


def expandable_segments() -> bool:
    """Whether the caching allocator makes expandable segments (``expandable_segments:True``)."""
    return allocator_settings().get("expandable_segments", "").lower() == "true"


#: The caching allocator's settings that move where its blocks land and that its model does not
#: have: under them the trials' requests are not replayed, and the real trials alone place the
#: answer (the line, as without a forecast).
UNMODELLED_SETTINGS = ("max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold")


def unmodelled_settings() -> list[str]:
    """The settings in force that the model of the caching allocator does not have, as ``key:value``."""
    settings = allocator_settings()
    return [f"{key}:{settings[key]}" for key in UNMODELLED_SETTINGS if key in settings]
