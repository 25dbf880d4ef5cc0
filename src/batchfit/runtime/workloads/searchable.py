"""Whether a workload can be searched in a mode on a device: checked before any trial runs, by
``find`` and ``predict`` alike."""

from __future__ import annotations

from batchfit.errors import ConfigurationError
from batchfit.policy.search.trial import Mode
from batchfit.runtime.devices.device import Device
from batchfit.runtime.workloads.workload import Workload, check_model_on


def check_searchable(workload: Workload, mode: Mode, device: Device, *, meta: bool = False) -> None:
    """The mode is one, it can run on this workload, and the model is on the search's device (or,
    with ``meta``, on the meta device: ``predict`` from the CPU alone traces it)."""
    if mode not in ("train", "eval"):
        raise ConfigurationError(f"mode={mode!r} is not a mode: use 'train' or 'eval'.")
    if mode == "train" and workload.optimizer is None and workload.train_step is None:
        raise ConfigurationError(
            "mode='train' needs Workload.optimizer (an Optimizer or a factory of one) "
            "or a train_step(model, optimizer, batch) function."
        )
    check_model_on(workload.module, device.torch_device, meta=meta)
    if workload.compiled and not device.measures_compiled:
        raise ConfigurationError(
            f"{device.name} cannot measure a torch.compile'd step ({', '.join(workload.compiled)}): "
            f"its modelled allocator sees what a dispatch mode sees, and Dynamo runs the step eagerly "
            f"under one. Use --device cpu (which reads the allocator's own events) or a GPU."
        )
