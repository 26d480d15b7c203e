"""The emulator's on-disk columns against a plain list: appends, array extends and later writes by index, read back
whole and by any slice, across the boundary between the file and the chunk still in memory."""
import tracemalloc

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from devices.emulated.columns import Column

_ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(-2**63, 2**63 - 1)),
    st.tuples(st.just("extend"), st.lists(st.integers(-2**40, 2**40), max_size=20)),
    st.tuples(st.just("set"), st.integers(0, 10**6), st.integers(-2**63, 2**63 - 1))), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, chunk=st.integers(1, 9), start=st.integers(-3, 200), stop=st.one_of(st.none(), st.integers(-3, 200)))
@example(ops=[("extend", [1, 2, 3])], chunk=2, start=0, stop=-3)  # a stop before the start: nothing, not an error
def test_a_column_reads_back_what_was_written_by_any_slice(ops, chunk, start, stop):
    column, oracle = Column("q", chunk), []
    for op in ops:
        if op[0] == "append":
            column.append(op[1])
            oracle.append(op[1])
        elif op[0] == "extend":
            column.extend(np.array(op[1], dtype=np.int64))
            oracle.extend(op[1])
        elif oracle:
            column[op[1] % len(oracle)] = op[2]
            oracle[op[1] % len(oracle)] = op[2]
    assert len(column) == len(oracle)
    assert column.numpy().tolist() == oracle
    lo = max(0, min(start, len(oracle)))
    hi = len(oracle) if stop is None else min(stop, len(oracle))
    got = column.numpy(start, stop)
    assert got.dtype == np.int64 and got.tolist() == oracle[lo:max(lo, hi)]
    if len(got):
        got[0] += 1  # a new array: the column is not changed through it
        assert column.numpy(start, stop).tolist() == oracle[lo:max(lo, hi)]


def test_reading_a_large_column_holds_one_copy_of_its_values():
    column = Column("q", 1 << 16)
    column.extend(np.arange(2_000_000, dtype=np.int64))
    column.append(7)  # and a value still in memory
    tracemalloc.start()
    try:
        values = column.numpy()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert values[-1] == 7 and values[:-1].tolist() == list(range(2_000_000))
    assert peak < 1.25 * values.nbytes  # read straight into the result: not a buffer and then its copy
