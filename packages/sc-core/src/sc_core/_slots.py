"""Which slot takes the next free unit of a call: the speeds each slot has shown.

A call's units pinned to a slot all start at once; the free (unpinned) ones go to slots as
they become idle (see ``_call_path.py``). :class:`SlotSpeeds` remembers each slot's seconds
per row and how long its current units have run, and answers two questions:

* **keeps up** -- a slot within 1.5x of the fastest slot's time per row gets a second unit
  queued behind the one it runs (while at least one unit per slot is left), which hides the
  driver's round trip between units; a slow slot only ever holds one;
* **worth waiting for** -- an idle slow slot is given nothing when the other busy slots, at
  the speeds they have shown, would finish every unit left before it finished the next one:
  at the end of a batch a straggler is not left with work the others could have done.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

__all__ = ["SlotSpeeds"]

#: A slot whose time per row is within this factor of the fastest slot's keeps up.
KEEPS_UP = 1.5


class SlotSpeeds:
    """Seconds per row of each slot, measured unit by unit."""

    def __init__(self) -> None:
        self._per_row: dict[int, float] = {}
        self._busy_since: dict[int, float] = {}

    def started(self, slot: int, at: float | None = None) -> None:
        """``slot`` was idle and started a unit now (or at ``time.monotonic()`` ``at``)."""
        self._busy_since[slot] = time.monotonic() if at is None else at

    def finished(self, slot: int, rows: int) -> None:
        """``slot`` finished a unit of ``rows`` rows (padding included)."""
        now = time.monotonic()
        self._per_row[slot] = (now - self._busy_since.get(slot, now)) / max(1, rows)
        self._busy_since[slot] = now

    def keeps_up(self, slot: int) -> bool:
        mine = self._per_row.get(slot)
        return mine is not None and mine <= KEEPS_UP * min(self._per_row.values())

    def _backlog_s(self, slot: int, queued_rows: int, now: float) -> float:
        elapsed = now - self._busy_since.get(slot, now)
        return max(0.0, self._per_row[slot] * queued_rows - elapsed)

    def worth_waiting_for(
        self, slot: int, queued_rows: Sequence[int], rows_left: int, next_rows: int
    ) -> bool:
        """Whether idle ``slot`` should stay idle: it is slow, and the busy slots
        (``queued_rows[i]`` rows queued on slot ``i``) would finish the ``rows_left`` rows
        still free before it finished the next unit's ``next_rows``."""
        mine = self._per_row.get(slot)
        others = [i for i in self._per_row if i != slot and self._per_row[i] > 0 and queued_rows[i]]
        if mine is None or not others or not rows_left or self.keeps_up(slot):
            return False
        now = time.monotonic()
        rate = sum(1 / self._per_row[i] for i in others)  # rows per second
        backlog = sum(self._backlog_s(i, queued_rows[i], now) / self._per_row[i] for i in others)
        return mine * next_rows > (rows_left + backlog) / rate
