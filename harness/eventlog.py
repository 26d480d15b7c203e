"""Append-only event log (JSON Lines, fsynced per cycle) and its Parquet table, written as the run goes.

The JSONL file is the source of truth while a run is going: a crash loses at most the events since the
last `flush()`, and leaves at worst one torn final line, which `read_events` skips and reports. The durable
events also go, a row group at a time, into hidden Parquet parts beside it, so no campaign holds its events in
memory: `write_parquet` turns the parts into events.parquet at the end, a crashed run's parts are rebuilt
from the JSONL when it resumes.
"""
from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path
from typing import Iterable, Iterator

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness.errors import InputError
from harness.events import EVENT_COLUMNS, GROUND_TRUTH_COLUMNS, STAGES, Event

log = logging.getLogger(__name__)

_INT_COLUMNS = frozenset({"cycle", "ocs_port", "t_ns", "offset_ns", "uncertainty_ns", "truth_halfwidth_ns"})
EVENT_DTYPES = {c: ("int64" if c in _INT_COLUMNS else "string") for c in EVENT_COLUMNS}
GROUND_TRUTH_DTYPES = {c: ("int64" if c in _INT_COLUMNS else "string") for c in GROUND_TRUTH_COLUMNS}
ROW_GROUP_ROWS = 1 << 16  # events per Parquet row group written during a run (~1 100 cycles of 8 ports)


def _event_schema() -> pa.Schema:
    """events.parquet's schema, pandas metadata included (what `pa.Table.from_pandas` gives a typed frame of a
    whole log, `attrs` and all), so that pandas reads the string columns back as strings."""
    frame = _typed_frame([], EVENT_COLUMNS, EVENT_DTYPES)
    frame.attrs["torn_line"] = None
    return pa.Schema.from_pandas(frame, preserve_index=False)


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
    over joined once and its rows kept as given until they are durable; durable rows go to the Parquet parts
    a row group at a time (`spill`), so memory holds at most a row group's events whatever the run's length.
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
        self._unlisted: list[list[tuple[dict, bytes]]] = []  # encoded events handed over, not durable yet
        self._durable: list[dict] = []  # rows of durable events not in a Parquet part yet
        self._parts: list[Path] = []  # closed parts first, the one being written last
        self._writer: pq.ParquetWriter | None = None
        for stale in self.path.parent.glob(self._part_name("*")):  # a killed run's: the JSONL is the record
            stale.unlink()
        if self._durable_size:  # an interrupted run's events come first
            for frame in iter_events(self.path):
                self._write_rows(pa.Table.from_pandas(frame, schema=EVENT_SCHEMA, preserve_index=False))

    def _part_name(self, n) -> str:
        return f".{self.path.stem}.part{n}.parquet"

    def _write_rows(self, table: pa.Table) -> None:
        if self._writer is None:
            self._parts.append(self.path.with_name(self._part_name(len(self._parts) + 1)))
            self._writer = pq.ParquetWriter(self._parts[-1], EVENT_SCHEMA)
        self._writer.write_table(table, row_group_size=len(table) or 1)

    def spill(self, min_rows: int | None = None) -> None:
        """Write the durable rows to the Parquet parts as one row group once there are `min_rows` (a step
        calls this where a pause costs nothing: once a cycle's next command is out)."""
        rows = self._durable
        if len(rows) >= max(ROW_GROUP_ROWS if min_rows is None else min_rows, 1):
            self._durable = []
            self._write_rows(pa.Table.from_arrays(
                [pa.array([row[c] for row in rows], type=EVENT_SCHEMA.field(c).type) for c in EVENT_COLUMNS],
                schema=EVENT_SCHEMA))

    def _parts_closed(self) -> list[Path]:
        """Every durable event in the parts, the part being written closed (the next spill opens another)."""
        self.spill(1)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        return list(self._parts)

    def table(self, columns: list[str] | None = None, filter=None) -> pa.Table:
        """The durable events' `columns` (default: all) where `filter` (a pyarrow.compute expression) holds,
        read from the parts a row group at a time: memory holds what is returned."""
        import pyarrow.dataset as ds

        parts = self._parts_closed()
        if not parts:
            return EVENT_SCHEMA.empty_table().select(columns or list(EVENT_COLUMNS))
        return ds.dataset(parts, schema=EVENT_SCHEMA, format="parquet").to_table(columns=columns, filter=filter)

    def batches(self, columns: list[str], filter=None):
        """`table(columns, filter)` a record batch at a time, one fragment read at once (no read-ahead): memory
        holds a batch, not the run's events."""
        import pyarrow.dataset as ds

        parts = self._parts_closed()
        if parts:
            yield from ds.dataset(parts, schema=EVENT_SCHEMA, format="parquet").to_batches(
                columns=columns, filter=filter, batch_readahead=0, fragment_readahead=0)

    def events(self) -> pd.DataFrame:
        """Every event recorded in this run (typed as `read_events` gives them), read back from disk."""
        if self._failed is None:
            self.flush()
        table = self.table()
        return _typed_frame([], EVENT_COLUMNS, EVENT_DTYPES) if not len(table) else \
            table.to_pandas()[list(EVENT_COLUMNS)].astype(EVENT_DTYPES)

    def write_parquet(self, path: str | os.PathLike) -> int:
        """The run's durable events as one Parquet file at `path` (atomically; the schema `to_parquet` gives
        the JSONL), its parts then gone. Returns the number of events."""
        if self._failed is None and not self._file.closed:
            self.flush()
        parts, path = self._parts_closed(), Path(path)
        tmp = path.with_name(path.name + ".tmp")
        if len(parts) == 1:
            os.replace(parts[0], tmp)
        else:
            with pq.ParquetWriter(tmp, EVENT_SCHEMA) as writer:
                for part in parts:  # a row group at a time
                    source = pq.ParquetFile(part)
                    for group in range(source.num_row_groups):
                        writer.write_table(source.read_row_group(group))
        rows = pq.ParquetFile(tmp).metadata.num_rows
        _fsync_replace(tmp, path)
        for part in parts:
            part.unlink(missing_ok=True)
        self._parts = []
        return rows

    def wrap_file(self, wrap) -> object:
        """Replace the log's file object by `wrap(file)` (fault injection: a disk that fills up); returns
        the wrapper. Wrapping twice keeps the first wrapper."""
        if getattr(self, "_wrapped", None) is None:
            self._wrapped = self._file = wrap(self._file)
        return self._wrapped

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
            for encoded in self._unlisted:
                self._durable.extend(row for row, _ in encoded)
            self._unlisted.clear()
            self.spill(4 * ROW_GROUP_ROWS)  # a step that never spills (`spill`) is bounded here

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            if self._failed is None:
                self.flush()
        finally:
            self._file.close()
            if self._writer is not None:
                self._writer.close()
                self._writer = None

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
        self._unlisted.clear()  # not durable: never in the Parquet parts either
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


EVENT_SCHEMA = _event_schema()


def iter_events(path: str | os.PathLike, rows: int | None = None) -> Iterator[pd.DataFrame]:
    """Events from a JSONL log as typed DataFrames (EVENT_COLUMNS) of at most `rows` events each, read as they
    are needed (at least one frame, perhaps empty).

    An incomplete final line (crash mid-write) is skipped and reported in the last frame's
    `attrs["torn_line"]`; any other bad line is an InputError naming file and line.
    """
    path, rows = Path(path), rows or ROW_GROUP_ROWS
    shown = str(path)
    try:
        file = open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot read event log: {exc.strerror}", shown) from None
    with file:
        records, number, torn = [], 0, None
        for number, line in enumerate(file, 1):
            if line.endswith(b"\n"):
                records.append(_parse_event(line[:-1], shown, number))
            else:  # no trailing newline: the last line was being written when the run stopped
                try:
                    records.append(_parse_event(line, shown, number))
                except InputError:
                    torn = number
                    log.warning("%s:%d: ignoring the incomplete last line (the run stopped mid-write)", shown, torn)
            if len(records) == rows:
                yield _typed_frame(records, EVENT_COLUMNS, EVENT_DTYPES)
                records = []
    if records or not number or torn is not None:
        frame = _typed_frame(records, EVENT_COLUMNS, EVENT_DTYPES)
        frame.attrs["torn_line"] = torn
        yield frame


def read_events(path: str | os.PathLike) -> pd.DataFrame:
    """Events from a JSONL log as one typed DataFrame (EVENT_COLUMNS); see `iter_events`."""
    frames = list(iter_events(path))
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    frame.attrs["torn_line"] = frames[-1].attrs.get("torn_line")
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


def _fsync_replace(tmp: Path, path: Path) -> None:
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_parquet_atomic(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp)
    _fsync_replace(tmp, path)


def to_parquet(jsonl: str | os.PathLike, parquet: str | os.PathLike) -> int:
    """Convert a JSONL event log to Parquet with the contract columns (ints int64, strings string), a row group
    at a time; returns the number of events."""
    parquet = Path(parquet)
    tmp, rows = parquet.with_name(parquet.name + ".tmp"), 0
    with pq.ParquetWriter(tmp, EVENT_SCHEMA) as writer:
        for frame in iter_events(jsonl):
            writer.write_table(pa.Table.from_pandas(frame, schema=EVENT_SCHEMA, preserve_index=False),
                               row_group_size=len(frame) or 1)
            rows += len(frame)
    _fsync_replace(tmp, parquet)
    return rows


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

    def add(self, cycle: int, stage: str, host: str, port: str, t_ns: int, halfwidth_ns: int = 0) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        self._rows.append((int(cycle), stage, host, port, int(t_ns), int(halfwidth_ns)))

    def __len__(self) -> int:
        return len(self._rows)

    def frame(self) -> pd.DataFrame:
        return _typed_frame([dict(zip(GROUND_TRUTH_COLUMNS, r)) for r in self._rows], GROUND_TRUTH_COLUMNS,
                            GROUND_TRUTH_DTYPES)

    def write(self, path: str | os.PathLike) -> pd.DataFrame:
        frame = self.frame()
        _write_parquet_atomic(frame, Path(path))
        return frame
