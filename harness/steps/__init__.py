"""Playbook step types. Each module registers its steps with `harness.config.register_step`; the runner
calls `impl(ctx, step) -> StepOutcome`. A lab adds a step type by adding a module here (or importing one
that calls register_step before the playbook loads). The runner and the run record read the outcome's
fields, never a step's type name or private data.

A step imports no other step: what two steps share lives in the bench runtime (`harness.bench`) or in
`harness.outcome` (the outcome types, re-exported here for labs' step modules)."""
from harness.outcome import Check, CycleOutcome, StepOutcome, StepResult, resume_after_logged

__all__ = ["Check", "CycleOutcome", "StepOutcome", "StepResult", "resume_after_logged"]
