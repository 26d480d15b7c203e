"""What a step hands back to the runner (`impl(ctx, step) -> StepOutcome`) and the run record: the runner and
the record read these fields, never a step's type name or private data. Below the steps: a step module and
the runner both import it, no step imports another."""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, TypedDict


class Check(TypedDict):
    """One pass/fail check of a step (summary.json, JUnit cases, the HTML report): a typed record that is still
    the plain mapping every writer reads."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class ClaimRow:
    """One claim as the writers (summary.md, the HTML report) show it: its verdict in words and on what it rests.
    `verdict_class` is the bare verdict (holds | falsified | inconclusive | …) a writer styles by."""

    id: str
    statement: str
    verdict: str
    verdict_class: str
    bound: str  # what the analytic bound concludes
    model: str  # what the model concludes over the assumption grid


@dataclass(frozen=True)
class ScenarioCell:
    """One claim in one scenario: the bound's and the model's short verdicts, and the number of its reason."""

    bound: str
    model: str
    note: int  # 1-based, into ClaimsTable.notes
    verdict_class: str


@dataclass(frozen=True)
class ScenarioRow:
    scenario: str
    cells: tuple[ScenarioCell | None, ...]  # one per claim, in ClaimsTable.claims' order; None: not evaluated
    notes: tuple[int, ...]


@dataclass(frozen=True)
class ClaimsTable:
    """The claims × scenarios table, each reason once (`notes`), that every writer renders."""

    claims: tuple[ClaimRow, ...]
    rows: tuple[ScenarioRow, ...]
    notes: tuple[str, ...]
    legend: str
    assumptions: str


@dataclass(frozen=True)
class CycleOutcome:
    """One measured cycle's bookkeeping (harness clock), for `cycles.parquet` and resume."""

    cycle: int
    status: str  # ok | faulted
    begin_ns: int
    sent_ns: int
    completed_ns: int
    done_ns: int
    affected: tuple[str, ...] = ()
    missing: dict[str, list[str]] = field(default_factory=dict)  # port -> stages never seen
    causes: tuple[str, ...] = ()  # every fault source recorded for this cycle

    def row(self) -> dict[str, Any]:
        return {"cycle": self.cycle, "status": self.status, "begin_ns": self.begin_ns, "sent_ns": self.sent_ns,
                "completed_ns": self.completed_ns, "done_ns": self.done_ns}


class IntRows:
    """Rows of a fixed number of integers, one row a cycle of a campaign (a span, a truth window), kept as int64
    columns: 8 bytes a value where a tuple of Python ints took ~30, so what a step keeps per cycle does not grow
    its memory with the cycles run. Read as tuples."""

    def __init__(self, width: int, rows: Iterable[tuple[int, ...]] = ()):
        self._cols = [array("q") for _ in range(width)]
        for row in rows:
            self.append(row)

    def append(self, row: tuple[int, ...]) -> None:
        if len(row) != len(self._cols):
            raise ValueError(f"a row of {len(self._cols)} integers, not {len(row)}")
        for col, value in zip(self._cols, row):
            col.append(value)

    def __len__(self) -> int:
        return len(self._cols[0])

    def __getitem__(self, index: int) -> tuple[int, ...]:
        return tuple(col[index] for col in self._cols)

    def __setitem__(self, index: int, row: tuple[int, ...]) -> None:
        for col, value in zip(self._cols, row, strict=True):
            col[index] = value

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return zip(*self._cols)


class CycleOutcomes:
    """A step's CycleOutcome per measured cycle, kept compact (~50 bytes a cycle, where the objects took ~700): the
    times and codes of status and affected ports as int64 columns (a campaign repeats a few distinct ones), the
    missing stages and fault causes only for the cycles that have any. A sequence of CycleOutcome."""

    def __init__(self, outcomes: Iterable[CycleOutcome] = ()):
        self._rows = IntRows(7)  # cycle, status code, begin, sent, completed, done, affected code
        self._codes: dict[Any, int] = {}
        self._values: list = []
        self._extra: dict[int, tuple[dict, tuple]] = {}  # row -> (missing, causes), where either is not empty
        for o in outcomes:
            self.append(o)

    def _code(self, value) -> int:
        code = self._codes.get(value)
        if code is None:
            code = self._codes[value] = len(self._values)
            self._values.append(value)
        return code

    def _row(self, o: CycleOutcome) -> tuple[int, ...]:
        return (o.cycle, self._code(o.status), o.begin_ns, o.sent_ns, o.completed_ns, o.done_ns,
                self._code(tuple(o.affected)))

    def append(self, o: CycleOutcome) -> None:
        self._rows.append(self._row(o))
        if o.missing or o.causes:
            self._extra[len(self._rows) - 1] = (o.missing, o.causes)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> CycleOutcome:
        index = range(len(self))[index]
        cycle, status, begin, sent, completed, done, affected = self._rows[index]
        missing, causes = self._extra.get(index, ({}, ()))
        return CycleOutcome(cycle, self._values[status], begin, sent, completed, done, self._values[affected],
                            missing, causes)

    def __setitem__(self, index: int, o: CycleOutcome) -> None:
        index = range(len(self))[index]
        self._rows[index] = self._row(o)
        if o.missing or o.causes:
            self._extra[index] = (o.missing, o.causes)
        else:
            self._extra.pop(index, None)

    def __iter__(self) -> Iterator[CycleOutcome]:
        return (self[i] for i in range(len(self)))

    def __reversed__(self) -> Iterator[CycleOutcome]:
        return (self[i] for i in range(len(self) - 1, -1, -1))

    def frame(self):
        """`CycleOutcome.row()` of every cycle as a DataFrame, built from the columns (no row objects: a
        campaign's 10^5 cycles)."""
        import numpy as np
        import pandas as pd

        cycle, status, begin, sent, completed, done, _ = (np.array(c, dtype=np.int64) for c in self._rows._cols)
        values = np.empty(len(self._values), dtype=object)
        values[:] = self._values
        return pd.DataFrame({"cycle": cycle, "status": values[status], "begin_ns": begin, "sent_ns": sent,
                             "completed_ns": completed, "done_ns": done})

    def index_of(self, cycle: int) -> int | None:
        """The row of `cycle` (the latest, if recorded twice), or None."""
        cycles = self._rows._cols[0]
        for i in range(len(cycles) - 1, -1, -1):
            if cycles[i] == cycle:
                return i
        return None


@dataclass
class StepOutcome:
    """What a step leaves for the run record and for later steps (`ctx.results[step.name]`).

    summary: headline results (summary.json `results.<step>`); cycles: measured cycles (cycles.parquet);
    truth_windows: (cycle, harness ns the cycle began) — how ground truth is assigned to cycles (a cycle
    of -1 is an unmeasured settling cycle); data: anything else later steps of the same run may read."""

    ok: bool = True
    checks: list[Check] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    summary_md: str = ""
    cycles: list[CycleOutcome] | CycleOutcomes = field(default_factory=list)
    truth_windows: list[tuple[int, int]] | IntRows = field(default_factory=list)
    artifacts: list[str] = field(default_factory=list)  # files the step wrote (run-dir relative): summary, report
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def skipped(cls, why: str) -> "StepOutcome":
        return cls(ok=False, checks=[Check(name="skipped: the bench is latched broken", ok=False, detail=why)],
                   data={"skipped": True})


StepResult = StepOutcome  # the earlier name, kept for labs' step modules


def resume_after_logged(run_dir, step, last_logged_cycle: int) -> int:
    """A step whose cycles are numbered as in events.jsonl resumes after the last complete one."""
    return last_logged_cycle
