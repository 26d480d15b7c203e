"""The one reader thread's multiplexing (harness.bench.readers), driven step by step through `poll()`."""
from __future__ import annotations

import os

from harness.bench.readers import StreamReaders


class PipeStream:
    """A stream over a real pipe: readable when bytes are written, ended when the writer closes."""

    def __init__(self):
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        self.buffer, self.t, self.closed_by_us = b"", 0, False
        self.exit_status, self.stderr = 0, ""

    def fileno(self):
        return self.r

    def send(self, data: bytes, t: int):
        self.t = t
        os.write(self.w, data)

    def read_available(self):
        eof = False
        try:
            while chunk := os.read(self.r, 4096):
                self.buffer += chunk
            eof = True  # read returned b"": writer closed
        except BlockingIOError:
            pass
        *lines, self.buffer = self.buffer.split(b"\n")
        out = [(self.t, x.decode()) for x in lines]
        if eof and self.buffer:
            out.append((self.t, self.buffer.decode()))
        return out, eof


def _serve(readers, rounds=3):
    return sum(readers.poll(0) for _ in range(rounds))


def test_lines_of_many_streams_arrive_in_order_per_stream_and_each_end_is_reported_once():
    readers = StreamReaders()
    streams = [PipeStream() for _ in range(5)]
    got = {i: [] for i in range(5)}
    ends = []
    for i, s in enumerate(streams):
        readers.add(s, lambda t, line, i=i: got[i].append((t, line)), lambda why, i=i: ends.append(i))
    _serve(readers)
    assert len(readers) == 5
    for i, s in enumerate(streams):
        s.send(f"a{i}\nb{i}\npart".encode(), t=10 + i)  # a partial line waits for its newline
    _serve(readers)
    assert got == {i: [(10 + i, f"a{i}"), (10 + i, f"b{i}")] for i in range(5)}
    streams[2].send(b"ial\n", t=99)
    os.close(streams[3].w)  # stream 3 ends: its partial line is still delivered, then its end, once
    _serve(readers, rounds=4)
    assert got[2][-1] == (99, "partial") and got[3][-1] == (13, "part")
    assert ends == [3] and len(readers) == 4


def test_a_removed_stream_delivers_nothing_more_and_its_descriptor_can_be_reused():
    readers = StreamReaders()
    old, new = PipeStream(), PipeStream()
    got, ends = [], []
    readers.add(old, lambda t, line: got.append(("old", line)), ends.append)
    _serve(readers)
    readers.remove(old)
    old.send(b"late\n", t=1)
    _serve(readers)
    assert got == [] and len(readers) == 0
    os.close(old.r)
    os.dup2(new.r, old.r)  # the closed stream's descriptor number now belongs to another stream
    new.r = old.r
    readers.add(new, lambda t, line: got.append(("new", line)), ends.append)
    new.send(b"fresh\n", t=2)
    _serve(readers)
    assert got == [("new", "fresh")] and ends == []


def test_a_stream_without_a_descriptor_is_read_by_a_thread_of_its_own():
    import threading

    done = threading.Event()
    got = []

    class Lines:
        def __iter__(self):
            yield from [(1, "x"), (2, "y")]

    StreamReaders().add(Lines(), lambda t, line: got.append(line), lambda why: done.set())
    assert done.wait(10) and got == ["x", "y"]


def test_background_clock_probes_per_period_stay_bounded_as_hosts_grow():
    from harness.bench.hosts import CLOCK_PROBE_BUDGET, background_rounds

    assert background_rounds(2, 24) == 24  # a small bench keeps each host's own count
    for hosts in (4, 8, 16, 64, 256, 1000):
        rounds = background_rounds(hosts, 24)
        assert rounds >= 1 and (rounds == 1 or rounds * hosts <= CLOCK_PROBE_BUDGET)
    assert background_rounds(8, 24) == 8 and background_rounds(64, 24) == 1 and background_rounds(256, 24) == 1


def test_a_stream_that_pushes_its_lines_needs_no_reader_thread():
    class Pushing:
        def deliver(self, on_lines, on_end):
            self.on_lines, self.on_end = on_lines, on_end
            return True

    readers, stream, got, ends = StreamReaders(start_on_use=True), Pushing(), [], []
    readers.add(stream, lambda t, line: got.append((t, line)), ends.append)
    stream.on_lines(7, ["a", "b"])  # what arrived in one packet, in one call
    stream.on_end()
    assert got == [(7, "a"), (7, "b")] and len(ends) == 1
    assert readers._thread is None and len(readers) == 0
    readers.remove(stream)
    assert stream.on_lines is None  # delivery stopped (deliver(None, None)), not a descriptor unregistered
