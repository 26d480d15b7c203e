"""Rows grouped by a few columns (a cycle and strings: stage, host, port) in numpy. What a campaign's end does per
block of cycles, pandas' groupby and merge on string columns did through per-call overhead and Arrow string
copies; here the columns become one int64 code per row once, and groups, firsts and joins are sorts and searches
on it. Pure.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


class Keys:
    """Each row of several frames keyed by `columns` as one int64 code, comparable across the frames and ordered as
    the tuples are (numbers by value, strings as Python orders them): groups come out in the order pandas' groupby
    gives them. A row with a missing value in any column is not `valid` (groupby drops it); its code still
    compares missing with missing, as a merge on the values written out does."""

    def __init__(self, frames: list[pd.DataFrame], columns: list[str]):
        self.columns = list(columns)
        parts = []  # per column: per frame its codes (0: missing), and the column's values (code - 1 indexes them)
        for name in self.columns:
            values = [f[name] for f in frames]
            if all(pd.api.types.is_integer_dtype(v.dtype) for v in values):
                ints = [v.to_numpy(dtype=np.int64) for v in values]
                low = min((int(i.min()) for i in ints if len(i)), default=0)
                high = max((int(i.max()) for i in ints if len(i)), default=0)
                parts.append(([i - low + 1 for i in ints], pd.RangeIndex(low, high + 1)))
                continue
            strings = [arrow_strings(v) for v in values]
            vocab = pa.array(sorted({x for a in strings for x in pc.unique(a).to_pylist() if x is not None}),
                             pa.string())
            parts.append(([pc.index_in(a, value_set=vocab).fill_null(-1).to_numpy().astype(np.int64) + 1
                           for a in strings], pd.Index(vocab.to_pylist(), dtype=_string_dtype(values[0]))))
        self.parts = parts
        span = 1
        for _, level in parts:
            span *= len(level) + 1
        if span >= 1 << 62:
            raise ValueError(f"{self.columns}: {span} distinct keys are too many for one int64 code")
        self.codes, self.valid = [], []
        for k in range(len(frames)):
            code = np.zeros(len(frames[k]), dtype=np.int64)
            valid = np.ones(len(frames[k]), dtype=bool)
            for codes, level in parts:
                code = code * (len(level) + 1) + codes[k]
                valid &= codes[k] > 0
            self.codes.append(code)
            self.valid.append(valid)

    def index(self, k: int, rows: np.ndarray) -> pd.MultiIndex:
        """The key columns of frame `k`'s `rows` as a MultiIndex (as a groupby's result has them)."""
        levels = [level for _, level in self.parts]
        codes = [column_codes[k][rows] - 1 for column_codes, _ in self.parts]  # (-1: missing)
        return pd.MultiIndex(levels=levels, codes=codes, names=self.columns,
                             verify_integrity=False).remove_unused_levels()


def first_of_groups(code: np.ndarray, valid: np.ndarray, by: np.ndarray | None = None):
    """The valid rows grouped by `code`, in code order: (the rows' positions sorted by code, then by `by` (if
    given), then by position; where each group starts in that order). So `order[starts]` is each group's first row
    (its least `by`, the earliest row among ties), and a reduction over `x[order]` at `starts` is per group."""
    rows = np.flatnonzero(valid)  # (both sorts are stable: ties keep the rows' order)
    order = rows[np.argsort(code[rows], kind="stable") if by is None else np.lexsort((by[rows], code[rows]))]
    sorted_code = code[order]
    starts = np.flatnonzero(np.r_[True, sorted_code[1:] != sorted_code[:-1]]) if len(order) else \
        np.array([], dtype=np.int64)
    return order, starts


def arrow_strings(column: pd.Series) -> pa.Array:
    """A column's values as one Arrow string array (no copy where pandas holds them in Arrow already)."""
    values = pa.array(column.array if isinstance(column.dtype, pd.StringDtype) else column.astype(object),
                      from_pandas=True)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return values if values.type == pa.string() else values.cast(pa.string())


def _string_dtype(column: pd.Series):
    """The dtype a column's values keep as an index level: pandas' strings stay strings; anything else is object."""
    return column.dtype if isinstance(column.dtype, pd.StringDtype) else object


def equals(column: pd.Series, value: str) -> np.ndarray:
    """Where a string column holds `value` (missing: False), compared in Arrow."""
    return pc.equal(arrow_strings(column), value).fill_null(False).to_numpy(zero_copy_only=False)
