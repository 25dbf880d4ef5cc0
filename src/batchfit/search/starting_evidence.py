"""A saved prediction as a search's starting evidence (``find --start-from``): its allocator
records for the mode, replayed at the search's own budget to place the first trial, and joined to
the records the search's own trials add, which its replay pairs them with."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchfit.errors import ConfigurationError
from batchfit.policy.allocator.allocation_record import AllocationRecord
from batchfit.policy.capacity.capacity_prediction import CapacityPredictor
from batchfit.policy.capacity.cards import cublas_workspaces
from batchfit.policy.search.safe_band import band_top
from batchfit.policy.search.search_state import Candidates
from batchfit.policy.search.trial import Mode
from batchfit.policy.search.trial_cache import TrialCache
from batchfit.prediction.prediction import Prediction
from batchfit.runtime.devices.caching_device import CachingDevice
from batchfit.runtime.devices.cuda import CudaDevice
from batchfit.runtime.devices.device import Device

#: What ``find_batch_size(start_from=...)`` takes: a ``Prediction``, its ``to_dict()``, the JSON
#: ``batchfit predict --format json`` writes, or that file's path.
StartFrom = str | Path | Prediction | Mapping[str, Any]


@dataclass(frozen=True)
class StartingEvidence:
    """The allocator records a saved prediction holds for one mode, and whether they were
    recorded on the CPU alone (CUDA's allocator modelled, without what CUDA adds)."""

    records: dict[int, AllocationRecord]
    cpu_alone: bool
    source: str

    @classmethod
    def read(cls, start_from: StartFrom, mode: Mode) -> StartingEvidence:
        """The ``mode`` records of ``start_from``; a ConfigurationError where it holds none."""
        source = str(start_from) if isinstance(start_from, (str, Path)) else "the prediction given"
        document = _document(start_from)
        records = document.get("records", {}).get(mode)
        if not records:
            held = ", ".join(sorted(document.get("records", {}))) or "none"
            raise ConfigurationError(
                f"start_from: {source} holds no {mode} records (its modes: {held}). Predict that "
                f"mode too (batchfit predict --modes train,eval), or search from scratch without "
                f"start_from."
            )
        found = {int(size): AllocationRecord.from_dict(record) for size, record in records.items()}
        return cls(found, bool(document.get("cpu_alone", False)), source)

    def check_device(self, device: Device) -> None:
        """The records replay a caching allocator: the search must run behind one."""
        if not isinstance(device, CachingDevice):
            raise ConfigurationError(
                f"start_from: {self.source} replays CUDA's caching allocator, which {device.name} "
                f"does not run: search on cuda (or leave start_from out; the CPU places its trials "
                f"by its own fake-tensor trace)."
            )

    def seed(
        self, device: Device, budget_bytes: int, steps: int, candidates: Candidates, low: int = 1
    ) -> int | None:
        """Where the search's first trial goes: the largest candidate the records' replay places
        under the search's budget over ``steps`` steps, lowered to the top of the band below it
        where a size down to ``low`` fails (``policy.search.safe_band.band_top``; None: not even the
        smallest fits). Records from the CPU alone replayed for CUDA keep cuBLAS's workspaces beside
        them (Hopper's, the larger)."""
        foreign = self._foreign(device)
        return self.placed(budget_bytes, steps, candidates, device.soft_workspaces, foreign, low)

    def placed(
        self,
        budget_bytes: int,
        steps: int,
        candidates: Candidates,
        soft_workspaces: bool,
        foreign: bool,
        low: int = 1,
    ) -> int | None:
        """``seed`` without a device: its kernels' workspaces ``soft_workspaces`` (CUDA's cuDNN's),
        and ``foreign`` where the records come from the CPU alone and the search runs on CUDA."""
        kept = cublas_workspaces(hopper=True) if foreign else ()
        predictor = CapacityPredictor(self.records, steps, soft_workspaces, kept)
        largest = predictor.largest(budget_bytes, candidates)
        if largest is None:
            return None
        return band_top(lambda size: predictor.play(size, budget_bytes).fits, largest, low, candidates)

    def shared_records(self, device: Device) -> dict[int, AllocationRecord]:
        """The records the search's replay may pair with its trials' own: none where they come
        from the CPU alone and the search runs on CUDA (their requests are not CUDA's)."""
        return {} if self._foreign(device) else dict(self.records)

    def _foreign(self, device: Device) -> bool:
        return self.cpu_alone and isinstance(device, CudaDevice)


def _document(start_from: StartFrom) -> Mapping[str, Any]:
    """The prediction's dictionary: ``batchfit predict``'s JSON holds it as its one result."""
    if isinstance(start_from, Prediction):
        return start_from.to_dict()
    if isinstance(start_from, (str, Path)):
        try:
            document = json.loads(Path(start_from).read_text())
        except json.JSONDecodeError as error:
            raise ConfigurationError(
                f"start_from: {start_from} is not JSON ({error}); give what batchfit predict --format "
                f"json wrote."
            ) from error
    else:
        document = start_from
    if isinstance(document, Mapping) and document.get("command") == "predict" and document.get("results"):
        document = document["results"][0]  # the JSON envelope batchfit predict writes
    elif isinstance(document, Mapping) and isinstance(document.get("prediction"), Mapping):
        document = document["prediction"]  # written before the envelope
    if not isinstance(document, Mapping) or "records" not in document:
        raise ConfigurationError(
            f"start_from: {start_from if isinstance(start_from, (str, Path)) else 'the document'} is "
            f"not a saved prediction (no records); give what batchfit predict --format json wrote."
        )
    return document


@dataclass(frozen=True)
class Known:
    """What a search knows before its own trials: a ``cache`` shared by searches of one workload,
    mode and device (at other fractions), whose measurements it reuses instead of running them
    again, and ``start``, a saved prediction's records, which place its first trial."""

    cache: TrialCache | None = None
    start: StartingEvidence | None = None


#: Nothing known: the search measures everything itself.
NOTHING_KNOWN = Known()
