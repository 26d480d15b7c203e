"""The base of every declared spec (pydantic v2), shared by the devices' own files (timing profiles, fault
kinds) and the harness's (inventories, playbooks, step parameters): one set of rules and range types, so an
error reads the same wherever it is found. The harness maps errors to `file:line` (harness/specs.py)."""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Spec(BaseModel):
    """Unknown keys are errors, no type is coerced (YAML `"22"` is not 22, `true` is not 1), NaN and
    infinity are never valid settings."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class Expect(str):
    """What a constrained value must be, in the words an error uses (kept apart from the description,
    which a field may set for editors)."""


def ranged(kind: type, text: str, **bounds):
    """A number with bounds that the JSON Schema shows and an error states as `text`."""
    return Annotated[kind, Field(**bounds), Expect(text)]


Port = ranged(int, "a port number in 1..65535", ge=1, le=65535)
Interval = ranged(int, "a positive interval", gt=0)
NonNegative = ranged(float, "a value >= 0", ge=0)
Seconds = NonNegative  # a duration, in any unit
Count = ranged(int, "a value >= 0", ge=0)
AtLeastOne = ranged(int, "a value >= 1", ge=1)
Positive = ranged(float, "a value > 0", gt=0)
Fraction = ranged(float, "a value in (0, 1]", gt=0, le=1)
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]+$", description="letters, digits, '_', '.', '-'")]
