"""Event log: JSONL append + fsync, torn last line, corruption, ENOSPC, Parquet dtypes."""
from __future__ import annotations

import dataclasses
import errno
import json

import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from harness.errors import InputError
from harness.eventlog import EventLog, EventLogError, GroundTruth, read_events, read_parquet_events, to_parquet
from harness.events import EVENT_COLUMNS, GROUND_TRUTH_COLUMNS, STAGES, Event


def make_event(i: int, stage: str = "phy_up") -> Event:
    return Event(run_id="r1", cycle=i // 3, stage=stage, host=f"gpu{i % 4}", device="mlx5_0", port="ens1f0np0",
                 ocs_port=17 + i % 8, t_ns=10**12 + i * 1_000_003, offset_ns=-40_000_000 + i,
                 uncertainty_ns=150_000, source="watch")


def events_equal(frame: pd.DataFrame, events: list[Event]) -> bool:
    expected = pd.DataFrame([e.to_dict() for e in events], columns=list(EVENT_COLUMNS))
    return frame.astype(object).values.tolist() == expected.astype(object).values.tolist()


def test_roundtrip_and_parquet_dtypes(tmp_path):
    events = [make_event(i, STAGES[i % len(STAGES)]) for i in range(50)]
    with EventLog(tmp_path / "events.jsonl") as log:
        for i, e in enumerate(events):
            log.append(e)
            if i % 10 == 9:
                log.flush()
    frame = read_events(tmp_path / "events.jsonl")
    assert events_equal(frame, events) and frame.attrs["torn_line"] is None
    assert to_parquet(tmp_path / "events.jsonl", tmp_path / "events.parquet") == len(events)
    back = read_parquet_events(tmp_path / "events.parquet")
    assert list(back.columns) == list(EVENT_COLUMNS)
    for column in EVENT_COLUMNS:
        want = "int64" if column in ("cycle", "ocs_port", "t_ns", "offset_ns", "uncertainty_ns") else "string"
        assert str(back[column].dtype) == want, column
        assert str(pd.read_parquet(tmp_path / "events.parquet")[column].dtype) == want, column  # as pandas reads it
    pd.testing.assert_frame_equal(back, frame)


def test_the_log_keeps_the_runs_events_in_memory_also_across_a_resume(tmp_path):
    path = tmp_path / "events.jsonl"
    first, later = [make_event(i, "phy_up") for i in range(5)], [make_event(i, "fault") for i in range(5, 8)]
    with EventLog(path) as log:
        log.extend(first)
        log.flush()
        pd.testing.assert_frame_equal(log.events(), read_events(path))
    with EventLog(path) as resumed:  # a resumed run opens the same log: what was recorded comes first
        resumed.extend(later)
        resumed.flush()
        assert events_equal(resumed.events(), first + later)
        pd.testing.assert_frame_equal(resumed.events(), read_events(path))


def test_the_durable_events_stream_to_parquet_as_the_run_goes_in_row_groups_of_a_bounded_size(tmp_path, monkeypatch):
    # the log holds at most a row group's rows (and the cycle not yet durable) whatever the run's length; the
    # Parquet written from its parts is the one the JSONL converts to, across a resume and a read mid-run
    monkeypatch.setattr("harness.eventlog.ROW_GROUP_ROWS", 7)
    path = tmp_path / "events.jsonl"
    events = [make_event(i, STAGES[i % len(STAGES)]) for i in range(60)]
    with EventLog(path) as log:
        for i in range(0, 42, 3):  # cycles of 3 events
            log.extend(events[i:i + 3])
            log.flush()
            log.spill()
            assert len(log._durable) < 7 and not log._unlisted
        assert log.durable_events == 42 and events_equal(log.events(), events[:42])  # read back from disk
        assert len(list(tmp_path.glob(".events.part*.parquet"))) == 1  # closed by the read: the next spill opens another
    with EventLog(path) as resumed:
        resumed.extend(events[42:])
        assert resumed.write_parquet(tmp_path / "events.parquet") == 60
    assert not list(tmp_path.glob(".events.part*"))
    streamed = pq.read_table(tmp_path / "events.parquet")
    to_parquet(path, tmp_path / "converted.parquet")
    assert streamed.equals(pq.read_table(tmp_path / "converted.parquet")) and streamed.num_rows == 60
    assert streamed.schema.equals(pq.read_schema(tmp_path / "converted.parquet"), check_metadata=True)
    assert pq.ParquetFile(tmp_path / "events.parquet").metadata.num_row_groups > 1


def test_a_killed_runs_parts_are_rebuilt_from_the_jsonl_on_resume(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.extend(make_event(i) for i in range(5))
    log.flush()
    log.events()  # a part written and closed, then the process dies (no close)
    path.with_name(".events.part9.parquet").write_bytes(b"torn")  # a part left half-written
    with EventLog(path) as resumed:
        resumed.extend([make_event(5)])
        assert events_equal(resumed.events(), [make_event(i) for i in range(6)])


def test_empty_log_gives_typed_empty_frame(tmp_path):
    EventLog(tmp_path / "e.jsonl").close()
    assert to_parquet(tmp_path / "e.jsonl", tmp_path / "e.parquet") == 0
    assert str(read_parquet_events(tmp_path / "e.parquet")["t_ns"].dtype) == "int64"
    with EventLog(tmp_path / "f.jsonl") as log:
        assert log.write_parquet(tmp_path / "f.parquet") == 0
    assert str(read_parquet_events(tmp_path / "f.parquet")["t_ns"].dtype) == "int64"


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 20), cut=st.integers(1, 400))
def test_torn_last_line_is_skipped(tmp_path_factory, n, cut):
    path = tmp_path_factory.mktemp("torn") / "events.jsonl"
    events = [make_event(i) for i in range(n)]
    with EventLog(path) as log:
        log.extend(events)
    raw = path.read_bytes()
    last_start = raw[:-1].rfind(b"\n") + 1
    cut = min(cut, len(raw) - last_start - 2)  # keep the last line incomplete (its "}" and "\n" gone)
    path.write_bytes(raw[: last_start + cut])
    frame = read_events(path)
    torn = cut > 0
    assert frame.attrs["torn_line"] == (n if torn else None)
    assert events_equal(frame, events[:-1])


def test_complete_last_line_without_newline_is_kept(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        log.extend(make_event(i) for i in range(3))
    path.write_bytes(path.read_bytes()[:-1])
    frame = read_events(path)
    assert frame.attrs["torn_line"] is None and len(frame) == 3


@pytest.mark.parametrize("line,why", [
    (b"{not json}\n", "corrupt"), (b"[1, 2]\n", "JSON object"), (b'{"run_id": "r"}\n', "missing"),
])
def test_corruption_before_the_end_names_the_line(tmp_path, line, why):
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        log.extend(make_event(i) for i in range(3))
    good = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(good[0] + line + good[1] + good[2])
    with pytest.raises(InputError) as info:
        read_events(path)
    assert info.value.line == 2 and why in info.value.message and info.value.file == str(path)


@pytest.mark.parametrize("field,value", [("t_ns", 1.5), ("t_ns", "1"), ("host", 3), ("stage", "warp"),
                                         ("cycle", True), ("extra", 1)])
def test_field_types_are_checked(tmp_path, field, value):
    record = make_event(0).to_dict() | {field: value}
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(make_event(1).to_dict()) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(InputError) as info:
        read_events(path)
    assert info.value.line == 2


class FullDisk:
    """Wraps the real file; accepts `budget` more bytes (a short write), then raises ENOSPC."""

    def __init__(self, real, budget: int):
        self.real, self.budget = real, budget

    def write(self, data):
        if self.budget <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = self.real.write(bytes(data[: self.budget]))
        self.budget -= n
        return n

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.parametrize("budget", [0, 1, 150, 10_000])
def test_disk_full_keeps_fsynced_events(tmp_path, budget):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    durable = [make_event(i) for i in range(10)]
    log.extend(durable)
    log.flush()
    log._file = FullDisk(log._file, budget)
    log.extend(make_event(i) for i in range(10, 200))
    with pytest.raises(EventLogError) as info:
        log.flush()
    assert info.value.errno == errno.ENOSPC and "disk full" in str(info.value)
    assert info.value.durable_events == 10 and info.value.lost_events == 190
    with pytest.raises(EventLogError):  # stays failed: no silent gaps later in the log
        log.append(make_event(500))
    log.close()
    frame = read_events(path)
    assert frame.attrs["torn_line"] is None and events_equal(frame, durable)


def test_ground_truth_parquet(tmp_path):
    truth = GroundTruth()
    truth.add(0, "light_detected", "gpu1", "ens1f0np0", 123)
    truth.add(1, "phy_up", "gpu2", "ens1f1np1", 2**62)
    with pytest.raises(ValueError):
        truth.add(0, "nope", "h", "p", 1)
    frame = truth.write(tmp_path / "gt.parquet")
    back = pd.read_parquet(tmp_path / "gt.parquet")
    assert list(back.columns) == list(GROUND_TRUTH_COLUMNS) and len(truth) == 2
    assert back["t_ns"].tolist() == [123, 2**62] and str(back["stage"].dtype) == "string"
    pd.testing.assert_frame_equal(back, frame)


def test_flush_returns_with_its_events_fsynced_and_an_fsync_error_surfaces_at_that_flush(tmp_path, monkeypatch):
    import os as _os

    synced = []
    real_fsync = _os.fsync

    def recording_fsync(fd):
        synced.append(len(read_events(tmp_path / "e.jsonl")))  # what the fsync covers: written before it
        real_fsync(fd)

    monkeypatch.setattr("harness.eventlog.os.fsync", recording_fsync)
    log = EventLog(tmp_path / "e.jsonl")
    log.append(make_event(1))
    log.flush()
    assert synced == [1] and log.durable_events == 1  # on this thread, before flush() returned
    log.append(make_event(2))
    log.flush()
    assert synced == [1, 2] and log.durable_events == 2

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("harness.eventlog.os.fsync", full)
    log.append(make_event(3))
    with pytest.raises(EventLogError) as info:
        log.flush()  # this flush, not a later one, reports that its events are not durable
    assert "disk full" in str(info.value) and info.value.durable_events == 2 and info.value.lost_events == 1
    log.close()
    assert events_equal(read_events(tmp_path / "e.jsonl"), [make_event(1), make_event(2)])


def test_an_events_dict_has_the_columns_in_order_and_its_line_is_compact_json():
    event = Event("r", 2, "phy_up", "gpu1", "mlx5_0", "ens1f0np0", 17, 5_000_000_123, -1_764_000_000 * 10**9, 61_000,
                  "agent-watch:carrier")
    assert list(event.to_dict()) == list(EVENT_COLUMNS)
    assert event.to_dict() == {c: getattr(event, c) for c in EVENT_COLUMNS}


def test_an_events_line_is_its_row():
    """`encode` writes the event dataclass itself: the same bytes as its row's, numpy integers included."""
    import numpy as np
    import orjson

    from harness.eventlog import encode
    from harness.events import Event

    for t in (0, 1_700_000_000_000_000_123, np.int64(5), -7):
        event = Event("run", 3, "phy_up", "gpu1", "mlx5_0", "eth0", 4, t, np.int64(-12), 9, "agent-watch:carrier")
        row, line = encode(event)
        assert row == event.to_dict() and list(row) == list(Event.__dataclass_fields__)
        assert line == orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def test_the_memory_the_log_holds_does_not_grow_with_the_cycles_it_records(tmp_path, monkeypatch):
    """An overnight campaign must not end out of memory: after 2N cycles the log holds what it held after N
    (at most a row group's rows), where a log that kept its events held ~20 KB more per cycle of 58 events."""
    import tracemalloc

    monkeypatch.setattr("harness.eventlog.ROW_GROUP_ROWS", 58 * 10)  # a row group every 10 cycles
    monkeypatch.setattr("harness.eventlog.os.fsync", lambda fd: None)  # memory is the question here, not the disk
    log = EventLog(tmp_path / "events.jsonl")

    def cycles(numbers):
        for c in numbers:
            log.extend([dataclasses.replace(make_event(i, STAGES[i % len(STAGES)]), cycle=c, t_ns=c * 10**9 + i)
                        for i in range(58)])
            log.flush()
            log.spill()

    cycles(range(1, 21))  # imports, caches, the first part's writer
    tracemalloc.start()
    try:
        cycles(range(21, 121))
        after_n = tracemalloc.get_traced_memory()[0]
        cycles(range(121, 221))
        after_2n = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        log.close()
    assert (after_2n - after_n) / 100 < 1000  # bytes a cycle
    assert log.write_parquet(tmp_path / "events.parquet") == 220 * 58
