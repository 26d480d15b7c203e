"""Append-only event log (JSON Lines, fsynced per cycle) and its conversion to Parquet.

The JSONL file is the source of truth while a run is going: a crash loses at most the events since the
last `flush()`, and leaves at worst one torn final line, which `read_events` skips and reports.
"""
from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path
from typing import Iterable

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness.errors import InputError
from harness.events import EVENT_COLUMNS, GROUND_TRUTH_COLUMNS, STAGES, Event

log = logging.getLogger(__name__)

_INT_COLUMNS = frozenset({"cycle", "ocs_port", "t_ns", "offset_ns", "uncertainty_ns"})
EVENT_DTYPES = {c: ("int64" if c in _INT_COLUMNS else "string") for c in EVENT_COLUMNS}
GROUND_TRUTH_DTYPES = {c: ("int64" if c in _INT_COLUMNS else "string") for c in GROUND_TRUTH_COLUMNS}


class EventLogError(OSError):
    """Writing the event log failed (e.g. disk full). Everything before `durable_events` is on disk."""

    def __init__(self, path: Path, cause: OSError, durable_events: int, lost_events: int):
        reason = "disk full" if cause.errno == errno.ENOSPC else (cause.strerror or str(cause))
        super().__init__(cause.errno, f"cannot write event log {path}: {reason}; {durable_events} events are "
                                      f"safely on disk, the last {lost_events} were not written")
        self.path, self.durable_events, self.lost_events = path, durable_events, lost_events

    def __str__(self) -> str:
        return self.strerror


class EventLog:
    """Append `Event`s to a JSONL file. Call `flush()` (fsync) at least once per cycle.

    Lines are buffered here (not in a Python file buffer) so that after a write error nothing half-written
    can reach the file later; the file is cut back to its last durable size. A cycle's lines are handed
    over joined once and its rows kept as given until `events()` asks (the cycle's end waits for neither).
    """

    write_through_bytes = 1 << 16

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._file = open(self.path, "ab", buffering=0)
        self._durable_size = os.fstat(self._file.fileno()).st_size  # bytes known to be on disk
        self._written_size = self._durable_size
        self._buffer: list[bytes] = []  # chunks of whole lines, not written yet
        self._buffered = 0  # their bytes
        self.durable_events = 0
        self._pending = 0
        self._failed: EventLogError | None = None
        # The run's events in memory too (those of an interrupted run first), so later steps read what was
        # recorded without parsing the log again.
        self._rows: list[dict] = read_events(self.path).to_dict(orient="records") if self._durable_size else []
        self._unlisted: list[list[tuple[dict, bytes]]] = []  # encoded events whose rows are not in _rows yet

    def wrap_file(self, wrap) -> object:
        """Replace the log's file object by `wrap(file)` (fault injection: a disk that fills up); returns
        the wrapper. Wrapping twice keeps the first wrapper."""
        if getattr(self, "_wrapped", None) is None:
            self._wrapped = self._file = wrap(self._file)
        return self._wrapped

    def events(self) -> pd.DataFrame:
        """Every event recorded in this run (typed as `read_events` gives them)."""
        for encoded in self._unlisted:
            self._rows.extend(row for row, _ in encoded)
        self._unlisted.clear()
        return _typed_frame(self._rows, EVENT_COLUMNS, EVENT_DTYPES)

    def append(self, event: Event) -> None:
        self.extend([event])

    def extend(self, events: Iterable[Event], encoded: list[tuple[dict, bytes]] | None = None) -> None:
        """Buffer `events`; `encoded`: their `encode(event)`, made earlier (a cycle encodes its events while
        it still waits for its last observations)."""
        self._check()
        if encoded is None:
            encoded = [encode(event) for event in events]
        self._unlisted.append(encoded)
        chunk = b"".join([line for _, line in encoded])
        self._buffer.append(chunk)
        self._buffered += len(chunk)
        self._pending += len(encoded)
        if self._buffered >= self.write_through_bytes:
            self.flush(fsync=False)

    def flush(self, fsync: bool = True) -> None:
        """Hand buffered events to the OS and, with fsync, to the disk: it returns with them durable (a run
        moves on only after its events are; an fsync overlapping the next cycle would break that)."""
        self._check()
        try:
            data, done = memoryview(self._buffer[0] if len(self._buffer) == 1 else b"".join(self._buffer)), 0
            while done < len(data):
                written = self._file.write(data[done:])  # a short write is not an error: go on
                if not written:
                    raise OSError(errno.EIO, "write made no progress")
                done += written
                self._written_size += written
            self._buffer.clear()
            self._buffered = 0
            if fsync:
                os.fsync(self._file.fileno())
        except OSError as exc:
            self._fail(exc)
        if fsync:
            self._durable_size = self._written_size
            self.durable_events += self._pending
            self._pending = 0

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            if self._failed is None:
                self.flush()
        finally:
            self._file.close()

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check(self) -> None:
        if self._failed is not None:
            raise self._failed
        if self._file.closed:
            raise ValueError(f"event log {self.path} is closed")

    def _fail(self, cause: OSError) -> None:
        self._failed = EventLogError(self.path, cause, self.durable_events, self._pending)
        self._buffer.clear()
        self._buffered = 0
        try:
            os.ftruncate(self._file.fileno(), self._durable_size)
        except OSError:  # the torn tail stays; read_events skips a torn last line anyway
            log.warning("could not truncate %s after a write error", self.path)
        raise self._failed from cause


def encode(event: Event) -> tuple[dict, bytes]:
    """An event's row (EVENT_COLUMNS) and its JSON line (orjson: ~0.3 µs; json.dumps ~6 µs)."""
    # The row is the frozen event's own field dict, not a copy: rows are only read (into DataFrames), never
    # changed. The newline is appended by copying, not with OPT_APPEND_NEWLINE: that keeps orjson's own
    # ~1 KiB buffer (malloc'd, not pymalloc) as the line, which lives until the next cycle: a fresh buffer per
    # event, ~6 page faults per port, 2.6 µs an event at a real 8x8 cycle's end against 0.56 µs this way.
    row = event.__dict__
    return row, orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def _typed_frame(rows: list[dict], columns: tuple[str, ...], dtypes: dict[str, str]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(columns))
    return frame.astype(dtypes) if len(frame) else pd.DataFrame(
        {c: pd.Series([], dtype=dtypes[c]) for c in columns})


def read_events(path: str | os.PathLike) -> pd.DataFrame:
    """Events from a JSONL log as a typed DataFrame (EVENT_COLUMNS).

    An incomplete final line (crash mid-write) is skipped and reported in `frame.attrs["torn_line"]`;
    any other bad line is an InputError naming file and line.
    """
    path = Path(path)
    shown = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read event log: {exc.strerror}", shown) from None
    lines = raw.split(b"\n")
    torn = None
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        # No trailing newline: the last line was being written when the run stopped.
        try:
            _parse_event(lines[-1], shown, len(lines))
        except InputError:
            torn = len(lines)
            lines.pop()
            log.warning("%s:%d: ignoring the incomplete last line (the run stopped mid-write)", shown, torn)
    rows = [_parse_event(line, shown, number) for number, line in enumerate(lines, 1)]
    frame = _typed_frame(rows, EVENT_COLUMNS, EVENT_DTYPES)
    frame.attrs["torn_line"] = torn
    return frame


def _parse_event(line: bytes, file: str, number: int) -> dict:
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"corrupt event log line: {exc}", file, number) from None
    if not isinstance(record, dict):
        raise InputError("corrupt event log line: expected a JSON object", file, number)
    missing = [c for c in EVENT_COLUMNS if c not in record]
    if missing:
        raise InputError(f"event is missing {', '.join(missing)}", file, number)
    extra = [c for c in record if c not in EVENT_COLUMNS]
    if extra:
        raise InputError(f"event has unknown field(s) {', '.join(extra)}", file, number)
    for column in EVENT_COLUMNS:
        value = record[column]
        want_int = column in _INT_COLUMNS
        ok = (type(value) is int and -2**63 <= value < 2**63) if want_int else isinstance(value, str)
        if not ok:
            raise InputError(f"event field {column}: expected {'an integer' if want_int else 'a string'}, "
                             f"found {value!r}"[:200], file, number)
    if record["stage"] not in STAGES:
        raise InputError(f"unknown stage {record['stage']!r}", file, number)
    return record


def _write_parquet_atomic(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def to_parquet(jsonl: str | os.PathLike, parquet: str | os.PathLike) -> pd.DataFrame:
    """Convert a JSONL event log to Parquet with the contract columns (ints int64, strings string)."""
    frame = read_events(jsonl)
    _write_parquet_atomic(frame, Path(parquet))
    return frame


def read_parquet_events(path: str | os.PathLike) -> pd.DataFrame:
    """events.parquet back as a DataFrame with the contract dtypes."""
    try:
        frame = pd.read_parquet(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot read events: {exc}", str(path)) from None
    missing = [c for c in EVENT_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(f"not an events table: missing column(s) {', '.join(missing)}", str(path))
    return frame[list(EVENT_COLUMNS)].astype(EVENT_DTYPES)


class GroundTruth:
    """Physical truth from an emulated bench (cycle, stage, host, port, t_ns), written once as Parquet."""

    def __init__(self):
        self._rows: list[tuple] = []

    def add(self, cycle: int, stage: str, host: str, port: str, t_ns: int) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        self._rows.append((int(cycle), stage, host, port, int(t_ns)))

    def __len__(self) -> int:
        return len(self._rows)

    def frame(self) -> pd.DataFrame:
        return _typed_frame([dict(zip(GROUND_TRUTH_COLUMNS, r)) for r in self._rows], GROUND_TRUTH_COLUMNS,
                            GROUND_TRUTH_DTYPES)

    def write(self, path: str | os.PathLike) -> pd.DataFrame:
        frame = self.frame()
        _write_parquet_atomic(frame, Path(path))
        return frame
