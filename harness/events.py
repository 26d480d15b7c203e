"""The one event schema, end to end: emulator ground truth, recorded events, Parquet, analysis."""
from __future__ import annotations

from devices.records import record

from analysis.stages import STAGES, STAGES_DOWN, STAGES_UP  # noqa: F401  (stage names are a contract)

EVENT_COLUMNS = ("run_id", "cycle", "stage", "host", "device", "port", "ocs_port", "t_ns", "offset_ns",
                 "uncertainty_ns", "source")
GROUND_TRUTH_COLUMNS = ("cycle", "stage", "host", "port", "t_ns", "truth_halfwidth_ns")  # t_ns ± half-width


@record
class Event:
    """One timestamped stage. `t_ns` is on the harness clock (CLOCK_MONOTONIC), already corrected by
    `offset_ns` (host clock minus harness clock) when it came from a host; the true time lies within
    t_ns ± uncertainty_ns."""

    run_id: str
    cycle: int
    stage: str
    host: str
    device: str
    port: str
    ocs_port: int
    t_ns: int
    offset_ns: int
    uncertainty_ns: int
    source: str

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"unknown stage {self.stage!r}; expected one of {', '.join(STAGES)}")

    def to_dict(self) -> dict:
        # not dataclasses.asdict: it deep-copies every field and costs ~10 µs an event on the cycle's path;
        # the fields are EVENT_COLUMNS, in order (tests/test_eventlog.py)
        return dict(self.__dict__)
