"""Playbook step types. Each module registers its steps with `harness.config.register_step`; the runner
calls `impl(ctx, step) -> StepResult`. A lab adds a step type by adding a module here (or importing one
that calls register_step before the playbook loads)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepResult:
    """What a step leaves for the run record and for later steps (`ctx.results[step.name]`)."""

    ok: bool = True
    data: dict[str, Any] = field(default_factory=dict)
    summary_md: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)  # {"name", "ok", "detail"}
