"""What a verb reports while it works: one ``Event`` type for every verb, heard by an
``on_progress`` callback (the command line's progress line, a log, a notebook's widget)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from batchfit.policy.explore.choose import Recommendation
from batchfit.policy.search.trial import Trial

#: started: a trial (``batch_size``) or a step of advise (``label``) begins; trial: a memory trial
#: ended; recommendation: explore's live recommendation changed; row, setting: compare measured a
#: technique, check-data a DataLoader setting (``message`` says what); reading: noise-scale read a
#: step's gradients (``message``: the estimate so far); note: something to know.
Stage = Literal["started", "trial", "recommendation", "row", "setting", "reading", "note"]


@dataclass(frozen=True)
class Event:
    """One thing that happened: which verb, what (``stage``), for what (``label``: the mode, the
    technique, advise's step), and what came of it."""

    verb: str
    stage: Stage
    label: str = ""
    batch_size: int | None = None
    trial: Trial | None = None
    recommendation: Recommendation | None = None
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def relabelled(self, verb: str, label: str) -> Event:
        """The same event told by an outer verb (analyze's ``train@0.8``, say)."""
        return replace(self, verb=verb, label=label)


OnProgress = Callable[[Event], None]


def tell(on_progress: OnProgress | None, event: Event) -> None:
    """Hand ``event`` to the callback, if there is one."""
    if on_progress is not None:
        on_progress(event)
