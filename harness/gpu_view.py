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
samples go to `gpu_samples.jsonl` (fsynced) and the manifest gets the windows (`windows_ns`, for the report's
plot) and, per host, the utilisation inside the
re-training windows (a cycle's `ocs_command_sent` to its last `port_active`, or the windows a step marks)
against between them (the steady state); a sample whose bound straddles a window edge is counted in neither.
"""
from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import os
import tempfile
import threading

from devices.errors import DeviceError
from devices.parsers.common import ParseError
from devices.parsers.gpu import parse_nvidia_smi_csv, parse_nvidia_timestamp
from devices.timing import now_ns

FIELDS = ("timestamp", "index", "utilization.gpu", "memory.used", "power.draw")
IDLE_PERCENT = 5  # at or below: the GPU is idle
INTERVAL_S = 0.2  # nvidia-smi's sleep between two queries of one host (a query itself takes tens of ms)
MAX_HOSTS = 16  # hosts sampled per step: a pod's GPUs are shown by a spread of its hosts (bounded tool load)
GAP_INTERVALS = 3  # successive samples of a host further apart than this many intervals: a gap in the view
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

    def arrived(self):
        """(harness ns its packet arrived, line) of every line, in the order they came."""
        self.lines.flush()
        self.lines.seek(0)
        for raw in self.lines:
            recv_ns, _, line = raw[:-1].partition(b" ")
            yield int(recv_ns), line.decode(errors="replace")


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

    def _host_samples(self, feed: _Feed):
        """The feed's lines as samples on the harness clock (after the step: the host's final clock model), one at
        a time."""
        zone = None
        for recv_ns, line in feed.arrived():
            if not line.strip():
                continue
            try:
                row = parse_nvidia_smi_csv(line, FIELDS, header=False).records()[0]
                naive = parse_nvidia_timestamp(str(row["timestamp"]))
            except ParseError:
                feed.others += 1
                feed.first_other = feed.first_other or line[:300]
                continue
            if zone is None:
                # The timestamp is local time without a zone: the zone is the whole quarter hour between it and the
                # host's clock when its first line arrived (the clock model's offset; a sample is well under 7 min
                # old).
                offset_ns = feed.session.to_harness(naive)[1]
                zone = round((naive - (recv_ns + offset_ns)) / ZONE_NS) * ZONE_NS
            host_ns = naive - zone
            t, _, bound = feed.session.to_harness(host_ns)  # the query began in [host_ns, host_ns + 1 ms)
            lo = t - bound
            hi = max(recv_ns, lo)  # read before its line was sent, so before it arrived
            yield {"step": self.step_name, "host": feed.host, "gpu": row["index"], "t_ns": (lo + hi) // 2,
                   "uncertainty_ns": (hi - lo + 1) // 2, "host_ns": host_ns,
                   "utilization_gpu": row["utilization.gpu"], "memory_used_mib": row["memory.used"],
                   "power_w": row["power.draw"]}

    def _feed_faults(self, feed: _Feed, samples: int, times: set[int]) -> str | None:
        """What a reader of the view must know about this host's samples (`samples` of them, at host `times`): an
        early end, gaps."""
        problems = []
        if feed.ends and samples:  # (no sample at all: a host without GPUs or nvidia-smi)
            problems.append(f"nvidia-smi stream ended {len(feed.ends)} time(s): " + "; ".join(
                f"{(t - self.started_ns) / 1e9:.1f} s into the step ({why})" for t, why, _ in feed.ends)
                + ("; no samples after the last" if feed.ends[-1][2] == feed.batches else ""))
        times = sorted(times)
        gaps = [(b - a) / 1e9 for a, b in zip(times, times[1:]) if b - a > GAP_INTERVALS * self.interval_s * 1e9]
        if gaps:
            problems.append(f"{len(gaps)} gap(s) in its samples, the longest {max(gaps):.2f} s")
        if feed.others:
            problems.append(f"{feed.others} line(s) not a sample, the first: {feed.first_other!r}")
        return "; ".join(problems) or None

    def window(self, begin_ns: int, end_ns: int) -> None:
        self.windows.append((begin_ns, end_ns))

    def _event_windows(self) -> list[tuple[int, int]]:
        """Each cycle's (first ocs_command_sent, last port_active) of the step's events, reduced a batch at a time."""
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
        per_cycle = {}
        for name, (parts, how) in ends.items():
            if parts:  # a cycle's events may straddle two batches: reduced again over the batches' results
                whole = pa.concat_tables(parts).group_by("cycle").aggregate([(f"t_ns_{how}", how)])
                per_cycle[name] = dict(zip(whole["cycle"].to_pylist(), whole[f"t_ns_{how}_{how}"].to_pylist()))
        pa.default_memory_pool().release_unused()  # the scan's buffers, back to the system
        sent, up = per_cycle.get("ocs_command_sent", {}), per_cycle.get("port_active", {})
        return [(sent[c], up[c]) for c in sorted(set(sent) & set(up))]

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
        # The samples go to the file as they are converted, and only counts stay: a step's samples are ~10^5 a
        # campaign. A window reaching past `t` from a begin at or before it: the latest end among the windows begun
        # by then (~10^5 windows: a search a sample, not every pair).
        path, out, windows, begins, reach = self.ctx.run_dir / "gpu_samples.jsonl", None, [], [], []
        counts: dict[str, list] = {}  # host -> [n inside, sum inside, idle inside, n between, sum between]
        total = 0

        def reached(t: int, by: int) -> bool:  # some window begun at or before `t` ends at or after `by`
            k = bisect.bisect_right(begins, t)
            return k > 0 and reach[k - 1] >= by

        try:
            for feed in self._feeds:
                n, times = 0, set()
                for s in self._host_samples(feed):
                    if out is None:
                        out = open(path, "a", encoding="utf-8")
                        windows = sorted(self.windows or self._event_windows())
                        begins = [b for b, _ in windows]
                        reach = list(itertools.accumulate((e for _, e in windows), max))
                    out.write(json.dumps(s, separators=(",", ":")) + "\n")
                    n += 1
                    times.add(s["host_ns"])
                    c = counts.setdefault(feed.host, [0, 0, 0, 0, 0])
                    util = s["utilization_gpu"]
                    if util is None or not windows:
                        continue
                    lo, hi = s["t_ns"] - s["uncertainty_ns"], s["t_ns"] + s["uncertainty_ns"]
                    if reached(lo, hi):  # within one window
                        c[0], c[1], c[2] = c[0] + 1, c[1] + util, c[2] + (util <= IDLE_PERCENT)
                    elif windows[0][0] <= lo and hi <= windows[-1][1] and not reached(hi, lo):  # touches none
                        c[3], c[4] = c[3] + 1, c[4] + util  # between two reconfigurations: the steady state
                feed.lines.close()
                total += n
                problem = self._feed_faults(feed, n, times)
                if problem:
                    self.faults[feed.host] = problem
                    self.ctx.say(f"{self.step_name}: GPU view of {feed.host}: {problem}")
            if out is not None:
                out.flush()
                os.fsync(out.fileno())
        finally:
            if out is not None:
                out.close()
        if not total or not windows:
            return {}
        summary = {"samples": total, "windows": len(windows), "hosts_total": self.hosts_total, "hosts": {},
                   "faults": dict(self.faults), "windows_ns": [[int(b), int(e)] for b, e in windows]}
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
