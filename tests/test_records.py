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


def test_a_steps_cycle_outcomes_are_kept_compact_and_read_back_as_they_were():
    """A campaign's per-cycle bookkeeping must not grow its memory by the ~700 bytes a CycleOutcome object took:
    after 2N cycles the table holds at most ~60 bytes a cycle more than after N; what is read back is what went in,
    a faulted cycle's missing stages and causes included, and a cycle relabelled later is found and replaced."""
    import tracemalloc

    from harness.outcome import CycleOutcome, CycleOutcomes, IntRows

    def outcome(c: int) -> CycleOutcome:
        faulted = c % 97 == 0
        return CycleOutcome(c, "faulted" if faulted else "ok", 10 * c, 10 * c + 1, 10 * c + 2, 10 * c + 3,
                            ("h1:p0", "h2:p0"), {"h1:p0": ["phy_up"]} if faulted else {},
                            ("timeout:h1:p0",) if faulted else ())

    table, windows = CycleOutcomes(), IntRows(2)
    tracemalloc.start()
    try:
        for c in range(1, 2001):
            table.append(outcome(c))
            windows.append((c, 10 * c))
        after_n = tracemalloc.get_traced_memory()[0]
        for c in range(2001, 4001):
            table.append(outcome(c))
            windows.append((c, 10 * c))
        after_2n = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert (after_2n - after_n) / 2000 < 100  # bytes a cycle, both tables
    assert list(table) == [outcome(c) for c in range(1, 4001)] and len(table) == 4000
    assert list(windows) == [(c, 10 * c) for c in range(1, 4001)] and windows[-1] == (4000, 40000)
    assert table[-1] == outcome(4000) and next(reversed(table)) == outcome(4000)
    i = table.index_of(1234)
    table[i] = CycleOutcome(1234, "faulted", 1, 2, 3, 4, ("h1:p0",), {}, ("clock-step:h1",))
    assert table[i].status == "faulted" and table[i].causes == ("clock-step:h1",) and table.index_of(99999) is None
    with pytest.raises(ValueError):
        windows.append((1, 2, 3))
