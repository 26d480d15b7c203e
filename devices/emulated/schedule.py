"""The emulated bench's schedule: actions kept in a heap ordered by due time, each run with its DUE time.

Follow-ups an action schedules are timed from that due time, never from when it actually ran: a late runner (a
busy machine) delays the wall-clock moment an action runs, but cannot reorder cause and effect or stretch a
delay. How late each action ran is recorded (`late_ns`; `summary`): the machine's load.

What a drawn delay's realised excess is (the draws' late column) depends on the bench: in process, every change
shows at its due time (a reader runs what is due before it reads; pushed changes carry their due times), so only
a start dated later than the command's arrival (`at`'s `late_ns`) adds to a draw; a bench that realises changes
in a kernel (`realised_when_run`: netns links, sshd hosts) shows them when they ran, so that lateness adds too."""
from __future__ import annotations

import heapq
import itertools
import threading
from typing import Callable

import numpy as np

from devices.emulated.columns import Column


class Schedule:
    """Not thread-safe: its owner holds the lock `wake` is built on around every call."""

    def __init__(self, clock: Callable[[], int], wake: threading.Condition, draw_late_ns: Column,
                 draw_due_ns: Column | None = None):
        self.now = clock
        self._wake = wake  # notified when a new earliest action is scheduled: the runner thread must wake sooner
        self._heap: list[tuple[int, int, Callable[[int], None], int, int]] = []  # (due, seq, action, draw, late)
        self._seq = itertools.count()
        self.late_ns = Column("q")  # how late every action ran
        self._draw_late_ns = draw_late_ns  # per draw: how much later than drawn it was realised (see above)
        self._draw_due_ns = draw_due_ns  # ... and when it was due (which harness cycle it belongs to)
        # The latest time a reader saw the state at, and the due time of the last action run: a change dated
        # back (OpticalBench.ocs_apply's at_ns) must fall after both.
        self.observed_ns = self.ran_ns = 0
        self.realised_when_run = False  # a kernel realises the changes when their actions run (see above)

    def at(self, due_ns: int, action: Callable[[int], None], draw: int = -1, late_ns: int = 0) -> None:
        """Run `action(due_ns)` when due; `draw` is the index of the drawn delay that set the due time, `late_ns`
        how much later than drawn its chain started (a switch that began moving after the command arrived)."""
        heapq.heappush(self._heap, (due_ns, next(self._seq), action, draw, late_ns))
        if draw >= 0 and late_ns:
            self._draw_late_ns[draw] = late_ns
        if self._heap[0][0] == due_ns:
            self._wake.notify()

    def next_due(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def run_due(self, observed: bool = True) -> None:
        """Run, in due order and each at its due time, every action due by now; `observed`: the caller reads
        the state at now (not only changes it).

        Follow-ups an action schedules are due after it, so they run in this same pass when they too are
        due: lateness never reorders events, and nobody reads a state older than the schedule says."""
        now = self.now()
        if observed:
            self.observed_ns = now
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, _, action, draw, late = heapq.heappop(heap)
            self.ran_ns = max(self.ran_ns, due)
            self.late_ns.append(now - due)
            if draw >= 0:
                if self.realised_when_run:
                    self._draw_late_ns[draw] = late + now - due
                if self._draw_due_ns is not None:
                    self._draw_due_ns[draw] = due
            action(due)

    @staticmethod
    def summary(late_ns, scratch: bool = False) -> dict:
        """n, p50, p99 and max in ms of the lateness values `late_ns`; `scratch`: an array of the caller's that may
        be reordered in place (a campaign's ~10^7 values: no second copy)."""
        late = np.asarray(late_ns)
        if late.size == 0:
            return {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
        latest = float(late.max()) / 1e6
        p50, p99 = np.quantile(late, [0.5, 0.99], overwrite_input=scratch or late is not late_ns) / 1e6
        return {"n": int(late.size), "p50_ms": float(p50), "p99_ms": float(p99), "max_ms": latest}
