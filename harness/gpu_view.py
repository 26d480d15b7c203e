"""The GPUs' side of a reconfiguration: `nvidia-smi` utilisation sampled on the hosts that have GPUs while a
step reconfigures the network, so a run shows what the GPUs did while the links re-trained.

Each sampled host (at most MAX_HOSTS, spread over the step's hosts: a pod's tool load stays bounded) runs ONE
`nvidia-smi --query-gpu=timestamp,... --format=csv,noheader,nounits -lms N` for the whole step, over the run's
SSH connection: nvidia-smi's own loop (a query, then a sleep of N ms), its lines pushed off the SSH hub as they
arrive (no thread, no command per sample). Each sample carries the host's own time (`timestamp`: when the query
was made, local time, milliseconds); converted with the host's clock model (as every host observation), its
bound runs from that millisecond's start (minus the clock bound) to the harness time its line arrived — the
values were read after the query began and before they were sent, whatever the query cost on the host. A
stream that ends before the step does (host rebooted, nvidia-smi exited) is a fault of the view, reported with
its reason, and is started again (at most RESTARTS times); the hole it leaves is a gap (successive samples more
than GAP_INTERVALS intervals apart), also a fault. At the end of the step the
samples go to `gpu_samples.jsonl` (fsynced), the re-training windows (a cycle's `ocs_command_sent` to its last
`port_active`, or the windows a step marks) to `gpu_windows.npz` (for the report's plot), and the manifest gets,
per host, the utilisation inside the windows against between them (the steady state); a sample whose bound
straddles a window edge is counted in neither.
"""
from __future__ import annotations

import bisect
import contextlib
import io
import json
import math
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

from devices.errors import DeviceError
from devices.parsers.common import ParseError
from devices.parsers.gpu import cell_value, parse_nvidia_smi_csv, parse_nvidia_timestamp
from devices.timing import now_ns

FIELDS = ("timestamp", "index", "utilization.gpu", "memory.used", "power.draw")
IDLE_PERCENT = 5  # at or below: the GPU is idle
INTERVAL_S = 0.2  # nvidia-smi's sleep between two queries of one host (a query itself takes tens of ms)
MAX_HOSTS = 16  # hosts sampled per step: a pod's GPUs are shown by a spread of its hosts (bounded tool load)
GAP_INTERVALS = 3  # successive samples of a host further apart than this many intervals: a gap in the view
WINDOWS_FILE = "gpu_windows.npz"  # each viewed step's re-training windows: (begin_ns, end_ns) rows under its name
RESTARTS = 3  # a host's loop that ends while the step runs is started again at most this often (each end a fault)
ZONE_NS = 15 * 60 * 1_000_000_000  # time zones are whole quarter hours from UTC


def query(interval_s: float) -> str:
    return (f"nvidia-smi --query-gpu={','.join(FIELDS)} --format=csv,noheader,nounits "
            f"-lms {max(1, round(interval_s * 1000))}")


def spread(hosts: list[str], at_most: int = MAX_HOSTS) -> list[str]:
    """`at_most` of the hosts (in the order given), evenly spaced from the first to the last (all when fewer)."""
    if len(hosts) <= at_most:
        return hosts
    step = (len(hosts) - 1) / (at_most - 1)
    return [hosts[round(i * step)] for i in range(at_most)]


class _Feed:
    """One host's nvidia-smi loop: its lines as they arrived (through the run's observation log, which mirrors
    them raw), and how it ended. The lines wait for the step's end in an unnamed temporary file, not in memory:
    a host prints ~25 a second for as long as the step runs."""

    def __init__(self, host: str, session):
        self.host, self.session = host, session
        self.stream = None
        self.lines = tempfile.TemporaryFile(prefix="ocs-hil-gpu-")  # "RECV_NS LINE\n" per line, as they came
        self.batches = 0  # packets of lines arrived
        self.ends: list[tuple[int, str, int]] = []  # (harness ns, why, batches arrived by then): each early end
        self.others = 0  # lines that are no sample (an XID/ECC event nvidia-smi prints, an error) ...
        self.first_other = ""  # ... and the first of them

    def chunks(self, size: int):
        """Its lines as they came ("RECV_NS LINE", newline-ended), in chunks of whole lines of about `size` bytes."""
        self.lines.flush()
        self.lines.seek(0)
        rest = b""
        while data := self.lines.read(size):
            data = rest + data
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            if cut:
                yield data[:cut]


# ---- the step's end: a feed's lines to samples, a chunk at a time (a step's samples are ~10^5 a campaign)
CHUNK_BYTES = 1 << 20  # of a feed's lines converted at once: memory holds a chunk, not the step's lines
_CELL = r"[ !#-+\--~]*"  # printable ASCII but the CSV's comma and quote: csv.reader's cell, unchanged
# A line as nvidia-smi prints it (RE2, through Arrow): its arrival, a timestamp with a month 1-12 of 1970-2099 (read
# as UTC, well inside int64 ns), four plain cells. A line of another shape is read by the parser itself.
_LINE = (r"^\d{1,18} (?:19[7-9]\d|20\d\d)/(?:0[1-9]|1[0-2])/\d\d \d\d:\d\d:\d\d\.\d{3}"
         + f",{_CELL}" * (len(FIELDS) - 1) + "$")
_STAMP = 23  # characters of "YYYY/MM/DD HH:MM:SS.mmm"
_LONGEST = 100_000  # characters of a line beyond which csv.reader refuses a cell (its field size limit)
_SAFE = 1 << 62  # times and bounds below this in size: every sum and difference of a conversion fits int64


def _parse(line: str) -> tuple[dict, int] | None:
    """(row, its timestamp as ns read as UTC) of one line, or None when it is no sample."""
    try:
        row = parse_nvidia_smi_csv(line, FIELDS, header=False).records()[0]
        return row, parse_nvidia_timestamp(str(row["timestamp"]))
    except ParseError:
        return None


def _utc_ns(y, m, d, hh, mi, ss, ms):
    """parse_nvidia_timestamp's number over int64 arrays: calendar.timegm's arithmetic (a day, hour, ... out of its
    range counts on as there), the day from the civil date (March-based years, 400-year eras)."""
    y = y - (m <= 2)
    era = y // 400
    yoe = y - era * 400
    doe = yoe * 365 + yoe // 4 - yoe // 100 + (153 * ((m + 9) % 12) + 2) // 5 + d - 1
    days = era * 146_097 + doe - 719_468
    return ((((days * 24 + hh) * 60 + mi) * 60 + ss) * 1000 + ms) * 1_000_000


def _head_numbers(head) -> tuple[np.ndarray, list[np.ndarray]]:
    """Of plain lines' first cells ("RECV_NS YYYY/MM/DD HH:MM:SS.mmm", an Arrow string array): RECV_NS, and the
    stamp's year, month, day, hour, minute, second and millisecond, read from their digits in place."""
    offsets = np.frombuffer(head.buffers()[1], dtype=np.int32)[head.offset:head.offset + len(head) + 1]
    if len(offsets) < 2:
        return np.empty(0, dtype=np.int64), [np.empty(0, dtype=np.int64)] * 7
    text = np.frombuffer(head.buffers()[2], dtype=np.uint8)
    ends = offsets[1:, None]
    stamp = text[ends + np.arange(-_STAMP, 0, dtype=np.int32)] - np.uint8(ord("0"))
    # RECV_NS: up to 18 digits ending before the stamp's space, the places before its first one zero
    at = ends + np.arange(-_STAMP - 19, -_STAMP - 1, dtype=np.int32)
    recv = np.where(at >= offsets[:-1, None], text[np.maximum(at, 0)] - np.uint8(ord("0")), np.uint8(0))

    def number(digits: np.ndarray) -> np.ndarray:
        value = np.zeros(len(digits), dtype=np.int64)
        for column in digits.T:
            value = value * 10 + column
        return value

    return number(recv), [number(stamp[:, i:i + w]) for i, w in ((0, 4), (5, 2), (8, 2), (11, 2), (14, 2), (17, 2),
                                                                  (20, 3))]


class _Windows:
    """The step's windows, sorted, for classifying samples. A window reaching past `t` from a begin at or before it:
    the latest end among the windows begun by then (~10^5 windows: a search a sample, not every pair)."""

    def __init__(self, pairs: np.ndarray):
        self.pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]  # (begin_ns, end_ns) rows, as sorted() orders
        self.begins = np.ascontiguousarray(self.pairs[:, 0])
        self.reach = np.maximum.accumulate(self.pairs[:, 1]) if len(pairs) else self.begins
        self._lists = None

    def __len__(self) -> int:
        return len(self.pairs)

    def _reached(self, t: np.ndarray, by: np.ndarray) -> np.ndarray:  # a window begun at or before `t` ends at `by`+
        k = np.searchsorted(self.begins, t, side="right")
        return (k > 0) & (self.reach[k - 1] >= by)

    def classify(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Of samples bounded by [lo, hi]: within one window; touching none, between the first and the last."""
        inside = self._reached(lo, hi)
        return inside, ~inside & (self.pairs[0, 0] <= lo) & (hi <= self.pairs[-1, 1]) & ~self._reached(hi, lo)

    def count(self, c: list, util, lo: int, hi: int) -> None:
        """`classify` for one sample whose numbers may be any Python numbers, added to the counts `c`."""
        if self._lists is None:
            self._lists = self.begins.tolist(), self.reach.tolist()
        begins, reach = self._lists

        def reached(t, by) -> bool:
            k = bisect.bisect_right(begins, t)
            return k > 0 and reach[k - 1] >= by

        if reached(lo, hi):  # within one window
            c[0], c[1], c[2] = c[0] + 1, c[1] + util, c[2] + (util <= IDLE_PERCENT)
        elif begins[0] <= lo and hi <= int(self.pairs[-1, 1]) and not reached(hi, lo):  # touches none
            c[3], c[4] = c[3] + 1, c[4] + util  # between two reconfigurations: the steady state


class _Host:
    """One feed's samples as they are converted (after the step: the host's final clock model): its zone, how many,
    their distinct host times, and the utilisation counts inside and between the windows (`windows()`: the step's,
    found at the first sample). A chunk goes in bulk (`bulk`) unless only the one-line path (`lines`, the reference
    the bulk path equals) can take it exactly: numbers beyond int64, a utilisation that is not an integer."""

    def __init__(self, feed: _Feed, step: str, windows):
        self.feed, self.step, self.windows = feed, step, windows
        self.zone: int | None = None
        self.n = 0
        self.counts = [0, 0, 0, 0, 0]  # n inside, sum inside, idle inside, n between, sum between
        self.times: list[np.ndarray] = []  # distinct host times, an array a chunk ...
        self.odd_times: set = set()  # ... and those of the one-line path
        self.prefix = f'{{"step":{json.dumps(step)},"host":{json.dumps(feed.host)},"gpu":'

    def _zone(self, recv_ns: int, naive: int) -> int:
        # The timestamp is local time without a zone: the zone is the whole quarter hour between it and the host's
        # clock when its first line arrived (the clock model's offset; a sample is well under 7 min old).
        offset_ns = self.feed.session.to_harness(naive)[1]
        return round((naive - (recv_ns + offset_ns)) / ZONE_NS) * ZONE_NS

    def _other(self, line: str) -> None:
        self.feed.others += 1
        self.feed.first_other = self.feed.first_other or line[:300]

    def lines(self, data: bytes) -> bytes:
        """The chunk's samples as JSON lines, converted one line at a time."""
        out = []
        for raw in data.split(b"\n")[:-1]:
            recv_ns, _, line = raw.partition(b" ")
            line = line.decode(errors="replace")
            if not line.strip():
                continue
            parsed = _parse(line)
            if parsed is None:
                self._other(line)
                continue
            row, naive = parsed
            if self.zone is None:
                self.zone = self._zone(int(recv_ns), naive)
            host_ns = naive - self.zone
            t, _, bound = self.feed.session.to_harness(host_ns)  # the query began in [host_ns, host_ns + 1 ms)
            lo = t - bound
            hi = max(int(recv_ns), lo)  # read before its line was sent, so before it arrived
            s = {"step": self.step, "host": self.feed.host, "gpu": row["index"], "t_ns": (lo + hi) // 2,
                 "uncertainty_ns": (hi - lo + 1) // 2, "host_ns": host_ns,
                 "utilization_gpu": row["utilization.gpu"], "memory_used_mib": row["memory.used"],
                 "power_w": row["power.draw"]}
            out.append(json.dumps(s, separators=(",", ":")) + "\n")
            self.n += 1
            self.odd_times.add(host_ns)
            windows = self.windows()
            if s["utilization_gpu"] is not None and len(windows):
                windows.count(self.counts, s["utilization_gpu"], s["t_ns"] - s["uncertainty_ns"],
                              s["t_ns"] + s["uncertainty_ns"])
        return "".join(out).encode()

    def bulk(self, data: bytes) -> memoryview | bytes | None:
        """The chunk's samples as JSON lines, converted in bulk; None when only `lines` can (nothing changed then).
        Each distinct cell text is typed by the parser's own `cell_value` and each distinct host time converted
        once."""
        import pyarrow as pa
        import pyarrow.compute as pc

        lines = pc.split_pattern(pa.array([data.decode(errors="replace")]), "\n").flatten()
        lines = lines.slice(0, len(lines) - 1)
        if len(lines) and pc.max(pc.utf8_length(lines)).as_py() > _LONGEST:
            return None
        plain = pc.match_substring_regex(lines, _LINE)
        cells = pc.split_pattern(lines.filter(plain), ",").flatten()  # FIELDS of each plain line, one after another
        plain = plain.to_numpy(zero_copy_only=False)

        def cell(k: int):
            return cells.take(pa.array(np.arange(k, len(cells), len(FIELDS))))

        recv_plain, stamp = _head_numbers(cell(0))
        # lines of another shape, read by the parser: a sample (rare: quoted or spaced cells), or none (counted)
        at, recv, naive, samples, others = [], [], [], [[] for _ in FIELDS[1:]], []
        for i in np.flatnonzero(~plain).tolist():
            recv_ns, _, line = lines[i].as_py().partition(" ")
            if not line.strip():
                continue
            parsed = _parse(line)
            if parsed is None:
                others.append(line)
                continue
            at.append(i)
            recv.append(int(recv_ns))
            naive.append(parsed[1])
            for column, field in zip(samples, FIELDS[1:]):
                column.append(parsed[0][field])

        values, index = [], []  # per cell column: its distinct values, and each sample's
        for k, (field, extra) in enumerate(zip(FIELDS[1:], samples), 1):
            coded = pc.dictionary_encode(cell(k))
            texts = coded.dictionary.to_pylist()
            values.append([cell_value(text, None, field) for text in texts] + extra)
            index.append(np.concatenate([coded.indices.to_numpy(zero_copy_only=False).astype(np.int64),
                                         np.arange(len(texts), len(texts) + len(extra))]))
        try:
            recv_ns = np.concatenate([recv_plain, np.array(recv, dtype=np.int64)])
            naive_ns = np.concatenate([_utc_ns(*stamp), np.array(naive, dtype=np.int64)])
        except OverflowError:
            return None
        if at:  # the parser's samples in their places
            order = np.argsort(np.concatenate([np.flatnonzero(plain), at]), kind="stable")
            recv_ns, naive_ns, index = recv_ns[order], naive_ns[order], [i[order] for i in index]
        zone = self.zone
        if len(recv_ns):
            zone = self._zone(int(recv_ns[0]), int(naive_ns[0])) if zone is None else zone
            if max(abs(zone) * 2, np.abs(naive_ns).max(), np.abs(recv_ns).max()) >= _SAFE:
                return None
            host_ns = naive_ns - zone
            distinct, where = np.unique(host_ns, return_inverse=True)
            try:  # the query began in [host_ns, host_ns + 1 ms)
                t, _, bound = self.feed.session.to_harness_many(distinct)
            except OverflowError:
                return None
            if int(np.abs(t).max()) + int(np.abs(bound).max()) >= _SAFE:
                return None
            lo = t[where] - bound[where]
            hi = np.maximum(recv_ns, lo)  # read before its line was sent, so before it arrived
            mid, half = (lo + hi) // 2, (hi - lo + 1) // 2
            windows = self.windows()
            if len(windows):
                util = values[1]
                if not all(u is None or (type(u) is int and abs(u) < 1 << 31) for u in util) or \
                        type(self.counts[1]) is not int or type(self.counts[4]) is not int:
                    return None  # (a float utilisation: its sums in the one-line order)
                known = np.array([u is not None for u in util], dtype=bool)[index[1]]
                util = np.array([u or 0 for u in util], dtype=np.int64)[index[1]]
                inside, between = windows.classify(mid - half, mid + half)
                inside, between = inside & known, between & known
        self.zone = zone
        for line in others:
            self._other(line)
        if not len(recv_ns):
            return b""
        self.n += len(mid)
        self.times.append(distinct)
        if len(windows):
            c = self.counts
            c[0] += int(inside.sum())
            c[1] += int(util[inside].sum())
            c[2] += int((util[inside] <= IDLE_PERCENT).sum())
            c[3] += int(between.sum())
            c[4] += int(util[between].sum())

        def text(a: np.ndarray):
            return pc.cast(pa.array(a), pa.string())

        def json_cell(k: int):
            return pa.array([json.dumps(v) for v in values[k]], pa.string()).take(pa.array(index[k]))

        joined = pc.binary_join_element_wise(
            self.prefix, json_cell(0), ',"t_ns":', text(mid), ',"uncertainty_ns":', text(half), ',"host_ns":',
            text(host_ns), ',"utilization_gpu":', json_cell(1), ',"memory_used_mib":', json_cell(2), ',"power_w":',
            json_cell(3), "}\n", "")
        offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32)
        return memoryview(joined.buffers()[2])[offsets[0]:offsets[len(joined)]]

    def gaps(self, longer_than_ns: float) -> tuple[int, float]:
        """(how many, the longest in s) of the gaps between successive distinct host times."""
        times = np.unique(np.concatenate(self.times)) if self.times else np.empty(0, dtype=np.int64)
        if self.odd_times:
            times = sorted(self.odd_times.union(times.tolist()))
            gaps = [b - a for a, b in zip(times, times[1:]) if b - a > longer_than_ns]
        else:
            steps = np.diff(times)
            gaps = steps[steps > math.floor(longer_than_ns)].tolist()  # (an int beyond x: beyond its floor)
        return len(gaps), max(gaps, default=0) / 1e9


class GpuView:
    def __init__(self, ctx, step_name: str, hosts, interval_s: float | None = None):
        self.ctx, self.step_name = ctx, step_name
        self.interval_s = INTERVAL_S if interval_s is None else interval_s
        order = {h: i for i, h in enumerate(ctx.inventory.hosts)}
        hosts = sorted(set(hosts), key=lambda h: (order.get(h, len(order)), h))  # the inventory's order
        self.hosts_total = len(hosts)
        self.hosts = spread(hosts)
        self.windows: list[tuple[int, int]] = []  # (begin_ns, end_ns) marked by the step
        self.faults: dict[str, str] = {}  # host -> what went wrong with its view (stream ended, gaps)
        self._feeds: list[_Feed] = []
        self._by_host: dict[str, _Feed] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # a stream (re)started vs the step's end
        self.started_ns = self.stopped_ns = 0
        self._log = None

    def start(self) -> "GpuView":
        # The run's own session per host (its connection, a channel for the step; its clock model converts the
        # samples): a host costs one SSH login per run.
        sessions = self.ctx.open_sessions(self.hosts)
        # Its lines go through the run's one observation log (mirrored raw with the hosts' other streams in
        # observations.jsonl) and come back here, not to the queue a cycle's wait reads.
        self._log = self.ctx.bench.observe()
        self._log.tap("gpu", self._arrived)
        self.started_ns = now_ns()
        for host in self.hosts:
            feed = _Feed(host, sessions[host])
            self._feeds.append(feed)
            self._by_host[host] = feed
            self._start(feed)
        return self

    def _start(self, feed: _Feed) -> None:
        from harness.bench.readers import shared_readers

        try:
            stream = feed.session.transport.stream(query(self.interval_s))
        except (DeviceError, OSError) as exc:
            feed.ends.append((now_ns(), f"cannot start nvidia-smi: {str(exc)[:300]}", feed.batches))
            return
        with self._lock:
            if self._stopping.is_set():
                stream.close()
                return
            feed.stream = stream
            shared_readers().add_lines(stream, lambda recv_ns, lines: self._put(feed.host, recv_ns, lines),
                                       lambda reason: self._ended(feed, reason))

    def _put(self, host: str, recv_ns: int, lines: list[str]) -> None:
        """A packet's lines, as they came, into the log: host_ns 0, the line carries its host's local-time stamp
        (its zone is found, and the stamp converted, at the step's end)."""
        from harness.bench.hosts import Observation

        batch = [Observation("gpu", host, "", "nvidia-smi", line, 0, 0, recv_ns) for line in lines if line.strip()]
        if batch:
            self._log.put_many(batch)

    def _arrived(self, batch: list) -> None:
        feed = self._by_host.get(batch[0].host)
        if feed is not None:
            recv = b"%d " % batch[0].recv_ns
            feed.lines.write(b"".join(recv + obs.value.replace("\n", " ").encode() + b"\n" for obs in batch))
            feed.batches += 1

    def _ended(self, feed: _Feed, reason: str) -> None:
        """Its loop ended while the step runs (the SSH hub's thread: the restart waits on a thread of its own)."""
        if self._stopping.is_set():
            return
        feed.ends.append((now_ns(), reason.strip()[:300], feed.batches))
        if feed.batches and len(feed.ends) <= RESTARTS:  # (no line ever: a host without GPUs or nvidia-smi)
            threading.Thread(target=self._restart, args=(feed,), daemon=True, name=f"gpu-view-{feed.host}").start()

    def _restart(self, feed: _Feed) -> None:
        if not self._stopping.wait(self.interval_s):
            self._start(feed)

    def _feed_faults(self, feed: _Feed, samples: int, gaps: tuple[int, float]) -> str | None:
        """What a reader of the view must know about this host's samples (`samples` of them, `gaps`: how many, the
        longest): an early end, gaps."""
        problems = []
        if feed.ends and samples:  # (no sample at all: a host without GPUs or nvidia-smi)
            problems.append(f"nvidia-smi stream ended {len(feed.ends)} time(s): " + "; ".join(
                f"{(t - self.started_ns) / 1e9:.1f} s into the step ({why})" for t, why, _ in feed.ends)
                + ("; no samples after the last" if feed.ends[-1][2] == feed.batches else ""))
        if gaps[0]:
            problems.append(f"{gaps[0]} gap(s) in its samples, the longest {gaps[1]:.2f} s")
        if feed.others:
            problems.append(f"{feed.others} line(s) not a sample, the first: {feed.first_other!r}")
        return "; ".join(problems) or None

    def window(self, begin_ns: int, end_ns: int) -> None:
        self.windows.append((begin_ns, end_ns))

    def _event_windows(self) -> np.ndarray:
        """Each cycle's (first ocs_command_sent, last port_active) of the step's events, reduced a batch at a time;
        (begin_ns, end_ns) rows."""
        import pyarrow as pa
        import pyarrow.compute as pc

        t, stage = pc.field("t_ns"), pc.field("stage")
        ends = {"ocs_command_sent": ([], "min"), "port_active": ([], "max")}
        for batch in self.ctx.log.batches(["cycle", "stage", "t_ns"], (t >= self.started_ns) & (t <= self.stopped_ns)
                                          & stage.isin(list(ends))):
            table = pa.Table.from_batches([batch])
            for name, (parts, how) in ends.items():
                rows = table.filter(pc.equal(table["stage"], name))
                parts.append(rows.group_by("cycle").aggregate([("t_ns", how)]))
        if not all(parts for parts, _ in ends.values()):
            return np.empty((0, 2), dtype=np.int64)
        # a cycle's events may straddle two batches: reduced again over the batches' results, then the cycles with both
        sent, up = (pa.concat_tables(parts).group_by("cycle").aggregate([(f"t_ns_{how}", how)])
                    for parts, how in ends.values())
        both = sent.join(up, "cycle", join_type="inner")
        pa.default_memory_pool().release_unused()  # the scan's buffers, back to the system
        return np.column_stack([both["t_ns_min_min"].to_numpy(), both["t_ns_max_max"].to_numpy()])

    def stop(self) -> dict:
        from harness.bench.readers import shared_readers

        with self._lock:
            self._stopping.set()
        readers = shared_readers()
        for feed in self._feeds:
            if feed.stream is not None:
                readers.remove(feed.stream)
                with contextlib.suppress(Exception):  # the connection may be gone already
                    feed.stream.close()
        if self._log is not None:
            self._log.tap("gpu", None)
        self.stopped_ns = now_ns()
        # The samples go to the file a chunk at a time, and only counts stay.
        path, out, total, found = self.ctx.run_dir / "gpu_samples.jsonl", None, 0, []
        counts: dict[str, list] = {}  # host -> [n inside, sum inside, idle inside, n between, sum between]

        def windows() -> _Windows:  # the step's, once there is a sample
            if not found:
                pairs = np.array(self.windows, dtype=np.int64).reshape(-1, 2) if self.windows else \
                    self._event_windows()
                found.append(_Windows(pairs))
            return found[0]

        try:
            for feed in self._feeds:
                host = _Host(feed, self.step_name, windows)
                for chunk in feed.chunks(CHUNK_BYTES):
                    samples = host.bulk(chunk)
                    if samples is None:
                        samples = host.lines(chunk)
                    if len(samples):
                        out = out or open(path, "ab")
                        out.write(samples)
                feed.lines.close()
                total += host.n
                if host.n:
                    counts[feed.host] = host.counts
                problem = self._feed_faults(feed, host.n, host.gaps(GAP_INTERVALS * self.interval_s * 1e9))
                if problem:
                    self.faults[feed.host] = problem
                    self.ctx.say(f"{self.step_name}: GPU view of {feed.host}: {problem}")
            if out is not None:
                out.flush()
                os.fsync(out.fileno())
        finally:
            if out is not None:
                out.close()
        if not total or not len(found[0]):
            return {}
        _save_windows(self.ctx.run_dir, self.step_name, found[0].pairs)
        summary = {"samples": total, "windows": len(found[0]), "hosts_total": self.hosts_total, "hosts": {},
                   "faults": dict(self.faults)}
        for host in sorted(counts):
            n_in, sum_in, idle_in, n_out, sum_out = counts[host]
            summary["hosts"][host] = {
                "n_inside": n_in, "n_outside": n_out,
                "mean_util_inside": sum_in / n_in if n_in else None,
                "mean_util_outside": sum_out / n_out if n_out else None,
                "idle_fraction_inside": idle_in / n_in if n_in else None}
        self.ctx.manifest_extra.setdefault("gpu_view", {})[self.step_name] = summary
        shown = [f"{h} {v['mean_util_inside']:.0f} % (between: {v['mean_util_outside']:.0f} %)"
                 for h, v in summary["hosts"].items() if v["mean_util_inside"] is not None
                 and v["mean_util_outside"] is not None]
        if shown:
            self.ctx.say(f"{self.step_name}: GPU utilisation while the network re-trains: " + ", ".join(shown))
        return summary


def _save_windows(run_dir: Path, step: str, pairs: np.ndarray) -> None:
    """The step's windows into WINDOWS_FILE (rewritten with the other steps' arrays: a run has a few viewed steps)."""
    import zipfile

    from harness.record import write_bytes_atomic

    path, out = run_dir / WINDOWS_FILE, io.BytesIO()
    with np.load(path) if path.is_file() else contextlib.nullcontext({}) as before, zipfile.ZipFile(out, "w") as npz:
        for name, rows in [*((n, before[n]) for n in before if n != step), (step, pairs)]:  # as np.savez writes
            with npz.open(f"{name}.npy", "w") as member:  # (np.savez's keywords would refuse a step named "file")
                np.lib.format.write_array(member, np.asarray(rows))
    write_bytes_atomic(path, out.getvalue())


def run_windows(run_dir, view: dict) -> np.ndarray:
    """A run's re-training windows, every viewed step's, as (begin_ns, end_ns) rows: WINDOWS_FILE, or the manifest's
    `windows_ns` of a run recorded before that file (`view`: the manifest's `extra.gpu_view`)."""
    path = Path(run_dir) / WINDOWS_FILE
    if path.is_file():
        with np.load(path) as steps:
            return np.concatenate([steps[name] for name in steps.files] or [np.empty((0, 2), dtype=np.int64)])
    return np.array([w for v in view.values() for w in v.get("windows_ns") or []], dtype=np.int64).reshape(-1, 2)


@contextlib.contextmanager
def gpu_view(ctx, step, hosts):
    """Sample the GPUs of `hosts` for the duration of the block (nothing on a dry run)."""
    if ctx.dry_run:
        yield None
        return
    view = GpuView(ctx, step.name, hosts).start()
    try:
        yield view
    finally:
        view.stop()


TABLE_HEAD = ["step", "host", "windows", "samples inside", "utilisation inside (%)", "idle inside",
              "samples between", "utilisation between (%)"]


def table_rows(view: dict) -> list[list[str]]:
    """The manifest's `extra.gpu_view` as rows under TABLE_HEAD (summary.md and the HTML report); '–' where a
    host had no sample in that group."""
    def pct(x, scale=1.0):
        return "–" if x is None else f"{scale * x:.0f}"

    return [[step, host, str(s["windows"]), str(v["n_inside"]), pct(v["mean_util_inside"]),
             pct(v["idle_fraction_inside"], 100) + (" %" if v["idle_fraction_inside"] is not None else ""),
             str(v["n_outside"]), pct(v["mean_util_outside"])]
            for step, s in view.items() for host, v in s["hosts"].items()]


def markdown(view: dict) -> list[str]:
    if not view:
        return []
    return (["## GPUs while the network re-trains", "",
             "`nvidia-smi` samples inside the re-training windows (OCS command to the last port ACTIVE, or the "
             "windows a step marks) against between them; a sample whose bound crosses a window edge is in neither.",
             "", "| " + " | ".join(TABLE_HEAD) + " |", "|" + "---|" * len(TABLE_HEAD)]
            + ["| " + " | ".join(row) + " |" for row in table_rows(view)] + [""]
            + [f"`{step}`: {len(s['hosts'])} of {s['hosts_total']} hosts sampled (spread evenly over the inventory)."
               for step, s in view.items() if s.get("hosts_total", 0) > len(s["hosts"])]
            + [f"**`{step}` GPU view fault, {host}:** {problem}"
               for step, s in view.items() for host, problem in (s.get("faults") or {}).items()])
