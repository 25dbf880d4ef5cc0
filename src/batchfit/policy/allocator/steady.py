"""When a trial's later steps can only repeat steps it ran: the allocator's state recurs.

A caching allocator places each request by its state alone (its segments, and their blocks' sizes
and states, in address order). Where every step makes the same requests (same shapes, same
optimizer step) and the state after step ``k`` equals the state after an earlier step ``j``, steps
``k+1, k+2, ...`` replay steps ``j+1 .. k`` block for block: none of them can fail where those did
not, so a trial asked for more steps is decided at step ``k``.

Two things can make a step's requests differ from an earlier one's, and the watch guards both:
an optimizer that has not stepped yet (its state is created lazily at its first step, and a
GradScaler skips the step while the scale is too large), so in training each step of the cycle
must have run ``optimizer.step``; and state the layout does not show (a retry returned segments
to the driver, and new ones come back at addresses the layout does not name), which the device
folds into what it reports as its state.
"""

from __future__ import annotations

from collections.abc import Hashable


class RecurrenceWatch:
    """Fed each step's end state, says when the last steps form a cycle that later steps repeat.

    ``needs_optimizer_step``: a step counts only when the optimizer stepped in it (training).
    """

    def __init__(self, needs_optimizer_step: bool) -> None:
        self.needs_optimizer_step = needs_optimizer_step
        self.steps = 0
        self._seen: dict[Hashable, int] = {}  # an end state -> the last step that ended in it
        self._last_unfit = 0  # the last step that cannot be part of a cycle

    def after_step(self, state: Hashable | None, optimizer_stepped: bool) -> int | None:
        """Record the state after the next step; the earlier step whose end state this step's end
        state repeats, when every step since ran as the cycle needs (else None)."""
        self.steps += 1
        if state is None or (self.needs_optimizer_step and not optimizer_stepped):
            self._last_unfit = self.steps
            return None
        earlier = self._seen.get(state)
        self._seen[state] = self.steps
        if earlier is not None and earlier >= self._last_unfit:
            return earlier
        return None
