"""`devices.records.record`: a frozen dataclass with a direct `__init__`, still every bit a frozen dataclass."""
from __future__ import annotations

import dataclasses

import pytest

from devices.records import record


@record
class _Point:
    x: int
    label: str

    def __post_init__(self):
        if self.x < 0:
            raise ValueError("x < 0")


@dataclasses.dataclass(frozen=True)
class _Plain:
    x: int
    label: str


def test_a_record_is_a_frozen_dataclass_made_without_setattr():
    p = _Point(1, label="a")
    assert dataclasses.is_dataclass(p) and vars(p) == vars(_Plain(1, "a")) and dataclasses.astuple(p) == (1, "a")
    assert p == _Point(1, "a") and hash(p) == hash(_Point(1, "a")) and p != _Point(2, "a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 2
    assert dataclasses.replace(p, x=5) == _Point(5, "a")
    with pytest.raises(ValueError, match="x < 0"):  # __post_init__ still runs
        _Point(-1, "a")
    with pytest.raises(TypeError):
        _Point(1)  # every field is required, as declared
    with pytest.raises(TypeError, match="no defaults"):
        record(type("_WithDefault", (), {"__annotations__": {"x": int}, "x": 0}))


def test_unchecked_makes_the_same_record_without_post_init():
    assert _Point.unchecked(1, "a") == _Point(1, "a") and vars(_Point.unchecked(1, "a")) == {"x": 1, "label": "a"}
    assert _Point.unchecked(-1, "a").x == -1  # the caller vouches for its values: no check runs
    with pytest.raises(dataclasses.FrozenInstanceError):
        _Point.unchecked(1, "a").x = 2
