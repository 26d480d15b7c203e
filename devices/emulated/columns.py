"""The emulated bench's per-event records (ground truth, drawn delays, lateness) as integer columns kept on disk but
for their last chunk: an emulator that runs in the harness's process must not grow it with the cycles run (a
campaign of 10^5 cycles on 8 ports records ~10^7 values a column)."""
from __future__ import annotations

import os
import tempfile
from array import array

import numpy as np

CHUNK = 1 << 16  # values kept in memory before they go to the column's file (512 KiB of int64)


class Column:
    """An append-only column of one `array` typecode. Full chunks go to an unnamed temporary file (gone when the
    process ends, however it ends); a value may still be set by index after it went there (`late_ns` is set when
    the action its draw timed runs). Not thread-safe: the physics' lock guards it."""

    def __init__(self, typecode: str, chunk: int | None = None):
        self.typecode, self._chunk = typecode, chunk or CHUNK
        self._tail = array(typecode)
        self._itemsize = self._tail.itemsize
        self._dtype = np.dtype(typecode)
        self._file = None
        self._spilled = 0  # values in the file

    def append(self, value: int) -> None:
        self._tail.append(value)
        if len(self._tail) >= self._chunk:
            self._spill()

    def extend(self, values) -> None:
        """Append an array of values (converted to the column's type)."""
        values = np.ascontiguousarray(values, dtype=self._dtype)
        if len(self._tail) + len(values) < self._chunk:
            self._tail.frombytes(values.tobytes())
            return
        self._spill()
        _pwrite_all(self._file.fileno(), memoryview(values).cast("B"), self._spilled * self._itemsize)
        self._spilled += len(values)

    def _spill(self) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="ocs-hil-column-")
        _pwrite_all(self._file.fileno(), memoryview(self._tail).cast("B"), self._spilled * self._itemsize)
        self._spilled += len(self._tail)
        self._tail = array(self.typecode)

    def __len__(self) -> int:
        return self._spilled + len(self._tail)

    def __iter__(self):
        return iter(self.numpy().tolist())

    def __array__(self, dtype=None, copy=None):
        values = self.numpy()
        return values if dtype is None else values.astype(dtype)

    def __setitem__(self, index: int, value: int) -> None:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"column index {index} out of range (length {len(self)})")
        if index >= self._spilled:
            self._tail[index - self._spilled] = value
        else:
            _pwrite_all(self._file.fileno(), array(self.typecode, [value]).tobytes(), index * self._itemsize)

    def numpy(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Values [start, stop) as a new numpy array of the column's type, read from the file straight into it (a
        campaign's column is ~10^7 values: one copy in memory, not two)."""
        stop = len(self) if stop is None else max(0, min(stop, len(self)))
        start = max(0, min(start, stop))
        out = np.empty(stop - start, dtype=self._dtype)
        if start < self._spilled:
            end = min(stop, self._spilled)
            _pread_into(self._file.fileno(), memoryview(out[:end - start]).cast("B"), start * self._itemsize)
        if stop > self._spilled:
            first, tail = max(start, self._spilled), np.frombuffer(self._tail, dtype=self._dtype)
            out[first - start:] = tail[first - self._spilled:stop - self._spilled]
        return out


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _pread_into(fd: int, view: memoryview, offset: int) -> None:
    got = 0
    while got < len(view):  # one read returns at most ~2 GiB on Linux
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise OSError(f"column file ended {len(view) - got} bytes early")
        got += n


def coded_strings(values, codes):
    """`values[codes]` as pandas' Arrow strings, taken in Arrow (no Python string a row): how the emulator's
    columns of a few distinct names (stages, hosts, ports) become a frame's."""
    import pandas as pd
    import pyarrow as pa

    strings = pa.array(list(values), pa.string()).take(pa.array(np.asarray(codes, dtype=np.int64)))
    return pd.array(strings, dtype=pd.StringDtype("pyarrow"))
