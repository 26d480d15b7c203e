"""What a step hands back to the runner (`impl(ctx, step) -> StepOutcome`) and the run record: the runner and
the record read these fields, never a step's type name or private data. Below the steps: a step module and
the runner both import it, no step imports another."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict


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
    cycles: list[CycleOutcome] = field(default_factory=list)
    truth_windows: list[tuple[int, int]] = field(default_factory=list)
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
