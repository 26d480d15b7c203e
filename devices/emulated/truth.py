"""The emulated bench's ground truth, kept compact: a campaign of 10^5 cycles records ~10^7 physical events."""
from __future__ import annotations

from devices.emulated.columns import Column

TRUTH_COLUMNS = ("t_ns", "stage", "host", "port", "ocs_port")
BLOCK_ROWS = 1 << 20  # rows read at once from the columns


class TruthLog:
    """Physical events `(t_ns, stage, host, port, ocs_port)` in the order they happened: each row's time in an
    int64 column and the rest as the code of one of the few distinct (stage, host, port, ocs_port) — 16 bytes
    a row where a dict took ~400, on disk but for the columns' last chunk (devices.emulated.columns). Appended
    under the physics' lock."""

    def __init__(self):
        self._t = Column("q")
        self._code = Column("q")
        self._codes: dict[tuple, int] = {}
        self._keys: list[tuple] = []

    def append(self, t_ns: int, stage: str, host: str, port: str, ocs_port: int) -> None:
        key = (stage, host, port, ocs_port)
        code = self._codes.get(key)
        if code is None:
            code = self._codes[key] = len(self._keys)
            self._keys.append(key)
        self._t.append(t_ns)
        self._code.append(code)

    def __len__(self) -> int:
        return len(self._t)

    def rows(self) -> list[dict]:
        keys = self._keys
        return [dict(zip(TRUTH_COLUMNS, (t, *keys[c]))) for t, c in zip(self._t.numpy().tolist(),
                                                                         self._code.numpy().tolist())]

    def columns(self, stages=None, start: int = 0, stop: int | None = None):
        """(t_ns, code) as int64 arrays (copies) of the rows of `stages` (all if None) among rows [start, stop) (all
        if not given), and the distinct (stage, host, port, ocs_port) the codes index."""
        import numpy as np

        keys = list(self._keys)
        wanted = None if stages is None else np.array([k[0] in stages for k in keys] or [False])
        t, code = [], []
        stop = len(self._t) if stop is None else min(stop, len(self._t))
        for at in range(start, stop, BLOCK_ROWS):  # a block at a time: only the rows kept are held whole
            end = min(stop, at + BLOCK_ROWS)
            t_block, code_block = self._t.numpy(at, end), self._code.numpy(at, end)
            if wanted is not None:
                keep = wanted[code_block]
                t_block, code_block = t_block[keep], code_block[keep]
            t.append(t_block)
            code.append(code_block)
        if not t:
            return np.array([], dtype=np.int64), np.array([], dtype=np.int64), keys
        return np.concatenate(t), np.concatenate(code), keys

    def frame(self, stages=None):
        """The rows as a DataFrame (TRUTH_COLUMNS), only those of `stages` if given."""
        return truth_frame(*self.columns(stages))


def truth_frame(t, code, keys, halfwidth=None):
    """Truth columns (TruthLog.columns) as a DataFrame of TRUTH_COLUMNS, the strings as pandas' Arrow strings taken
    from each column's few distinct values by code (no Python object a row); with `halfwidth` (ns a row's time may
    be off: its window's half), a truth_halfwidth_ns column as well."""
    import numpy as np
    import pandas as pd

    from devices.emulated.columns import coded_strings

    columns = {"t_ns": t}
    for i, name in enumerate(TRUTH_COLUMNS[1:]):
        values = [k[i] for k in keys]
        columns[name] = np.asarray(values, dtype=np.int64)[np.asarray(code, dtype=np.int64)] if name == "ocs_port" \
            else coded_strings(values, code)
    frame = pd.DataFrame(columns)
    if halfwidth is not None:
        frame["truth_halfwidth_ns"] = halfwidth
    return frame
