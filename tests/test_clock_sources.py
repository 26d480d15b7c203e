"""Clock sources a lab already runs (chrony, linuxptp) read through the harness's host path, their bounds, and the
cross-check against the SSH probe: on real captures, and (root + netns) against real chronyd -x and ptp4l -S
--free_running=1 between two namespaces over a veth pair. CLOCK_REALTIME is not namespaced: nothing here steers it."""
from __future__ import annotations

import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from devices.protocols import CommandResult, CommandTransport, LineStream
from devices.resources import HostResource
from devices.timing import CommandTiming, now_ns
from harness.clock import (ClockSample, ClockSyncError, ClockTracker, clock_source_entry,
                           cross_check, read_clock_sources, realtime_minus_monotonic, source_warnings)

DATA = Path(__file__).parent / "data" / "clock"
CHRONY_TOLD_S = 0.005  # the host's chronyd is told its source reads this far ahead (`server ... offset`)


def capture(name: str) -> str:
    return (DATA / name).read_text().partition("\n")[2]


def sections(chrony: str = "", ptp: str = "", date: str = "1796534018.000000000") -> str:
    return f"## chrony\n{chrony}## ptp\n{ptp}## date\n{date}\n"


def test_readings_from_real_captures():
    out = sections(capture("chronyc-c-tracking-slow-5ms.txt"), capture("pmc-time-status-current-data-set.txt"),
                   "1796533999.000000000")
    readings, absent = read_clock_sources(out)
    assert absent == {}
    chrony, ptp = readings["chrony"], readings["ptp"]
    # chronyd was told its source reads 5 ms ahead: this clock is 5 ms behind the reference
    assert chrony.offset_ns == -4_999_033 and chrony.bound_ns == abs(chrony.offset_ns) + chrony.width_ns
    # width: root dispersion + root delay / 2 + 0.2005 s since Ref time at (1 + 0.064 + 0) ppm
    assert chrony.width_ns == pytest.approx(544 + 5685 / 2 + 0.200436 * 1.064e3, abs=2)
    # ptp: master_offset -197 ns ± meanPathDelay 2361 ns + 2.65 ms since the sync at 1 ppm
    assert ptp.offset_ns == -197 and ptp.width_ns == pytest.approx(2361 + 2.649808, abs=1)
    assert "grandmaster 4eb648.fffe.fb5ee8" in ptp.reference


def test_every_ptp_section_is_a_sync_read_and_the_latest_date_dates_them():
    one, two = capture("pmc-time-status-current-data-set.txt"), capture("pmc-time-status-current-data-set-2.txt")
    out = sections(capture("chronyc-c-tracking-slow-5ms.txt"), one, "1796533999.000000000") + \
        f"## ptp\n{two}## date\n1796534018.000000000\n"
    readings, absent = read_clock_sources(out)
    ptp = readings["ptp"]
    assert absent == {} and ptp.host_ns == 1796534018 * 10**9
    # the second sync, 19 s later: its t2 - t1 (246 + 2226) is 308 ns above the first's (-197 + 2361), and the
    # clocks may have moved 19 us apart meanwhile; the first, grown 19 s at 1 ppm, is wider still
    assert ptp.offset_ns == 246 and ptp.width_ns == pytest.approx(2226 + 308 + 19_001.7 + 0.9, abs=1)


def test_absent_and_unsynced_sources_say_why():
    readings, absent = read_clock_sources(sections(ptp="sending: GET TIME_STATUS_NP\nsending: GET CURRENT_DATA_SET\n"))
    assert readings == {} and absent["chrony"].startswith("no chronyd answered")
    assert absent["ptp"].startswith("no ptp4l answered")
    # the Cumulus switch's second response: this clock is the grandmaster (gmPresent false, no sync taken)
    second = "\n".join(capture("public-pmc-time-status-cumulus.txt").splitlines()[10:19]) + "\n"
    assert second.startswith("    000200.fffe.000005-1 seq 0 RESPONSE")
    readings, absent = read_clock_sources(sections(ptp=second))
    assert "ptp" not in readings and absent["ptp"].startswith("ptp4l without a master sync (gmPresent False")
    # TIME_STATUS_NP alone has no path delay: no bound from it
    readings, absent = read_clock_sources(sections(ptp=capture("public-pmc-time-status-cumulus.txt")))
    assert "ptp" not in readings and "no path delay" in absent["ptp"]
    for broken in ("", sections(date="")):  # no date: the readings cannot be dated, the session says why
        with pytest.raises(ClockSyncError, match="clock sources"):
            read_clock_sources(broken)
    readings, absent = read_clock_sources(sections(chrony="garbage\n"))
    assert absent["chrony"].startswith("unreadable chronyc -c tracking: expected 14 comma-separated fields")


def test_cross_check_flags_only_a_disagreement_beyond_both_bounds():
    readings, _ = read_clock_sources(sections(capture("chronyc-c-tracking-fast-3ms.txt")))
    chrony = readings["chrony"]  # +3.0015 ms ± ~4.6 us
    realtime = (1_000_000_000, 50)
    agree = cross_check(chrony, (0, realtime[0] + 3_001_000, 20_000), realtime)
    assert agree["ok"] and agree["disagreement_ns"] == -484 and agree["allowed_ns"] == 20_050 + chrony.width_ns
    apart = cross_check(chrony, (0, realtime[0] + 3_001_484 + 20_051 + chrony.width_ns, 20_000), realtime)
    assert not apart["ok"]
    tracker = ClockTracker("h")
    tracker.add(ClockSample(t_ns=10**12, offset_ns=chrony.host_ns - 10**12 - 3_001_484, delay_ns=40_000,
                            uncertainty_ns=20_001))
    entry = clock_source_entry(readings, {}, tracker, realtime_minus_monotonic())
    assert set(entry["chrony"]) == {"offset_ns", "width_ns", "bound_ns", "host_ns", "reference", "rule", "probe"}
    warned = source_warnings([{"host": "h", "sources": {"chrony": {**entry["chrony"], "probe": apart}}}])
    assert len(warned) == 1 and warned[0].startswith("clock of h: chrony says +3001.5 µs")
    assert source_warnings([{"host": "h", "sources": {"chrony": {**entry["chrony"], "probe": agree}}}]) == []


# ---------------------------------------------------------------- real daemons in namespaces


class _Lines(LineStream):
    """A local process's stdout lines, stamped as they are read (a stand-in for SSH: same agent, same probe)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines = proc, queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put((now_ns(), line.rstrip("\n")))

    def readline(self, deadline):
        try:
            left = deadline.remaining()
            return self.lines.get(timeout=None if left is None else max(0.0, left))
        except queue.Empty:
            return None

    def write(self, data: str) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def __iter__(self):
        raise NotImplementedError

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class NetnsTransport(CommandTransport):
    """Commands run in a network namespace as a login shell would run them (cwd = the 'home' directory)."""

    def __init__(self, ns: str, home: Path):
        self.ns, self.home, self.streams = ns, home, []

    def connect(self) -> None:
        pass

    def run(self, command, *, deadline=None, stdin=None, check=False):
        sent = now_ns()
        p = subprocess.run(["ip", "netns", "exec", self.ns, "sh", "-c", command], cwd=self.home, timeout=10,
                           input=stdin.encode() if isinstance(stdin, str) else stdin, capture_output=True)
        assert not check or p.returncode == 0, p.stderr
        return CommandResult(command, p.returncode, p.stdout.decode(), p.stderr.decode(),
                             CommandTiming(sent_ns=sent, completed_ns=now_ns()))

    def stream(self, command):
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns, "sh", "-c", command], cwd=self.home, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=1)
        self.streams.append(_Lines(proc))
        return self.streams[-1]

    def close(self) -> None:
        for s in self.streams:
            s.close()


def _need(*tools):
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt: linuxptp, chrony, iproute2)")


@pytest.fixture
def lab(tmp_path):
    """Two namespaces over a veth pair: the reference (ptp4l master, chronyd server) and the host (ptp4l slave,
    chronyd client told its source reads 5 ms ahead), all free running / -x. Torn down whatever happens."""
    _need("ip", "ptp4l", "pmc", "chronyd", "chronyc")
    tag = f"cs{os.getpid() % 100000}"
    ref, host = f"{tag}r", f"{tag}h"
    procs: list[subprocess.Popen] = []
    sh = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    try:
        sh("ip", "netns", "add", ref)
        sh("ip", "netns", "add", host)
        sh("ip", "link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b")
        for ns, dev, addr in ((ref, f"{tag}a", "10.201.0.1/24"), (host, f"{tag}b", "10.201.0.2/24")):
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        fast = "logAnnounceInterval -3\nannounceReceiptTimeout 2\nlogSyncInterval -3\nlogMinDelayReqInterval -3\n"
        (tmp_path / "m.cfg").write_text(f"[global]\nuds_address {tmp_path}/ptp-m\nfree_running 1\npriority1 1\n{fast}")
        (tmp_path / "s.cfg").write_text(f"[global]\nuds_address {tmp_path}/ptp-s\nfree_running 1\nslaveOnly 1\n{fast}")
        for d in ("cr", "ch"):
            (tmp_path / d).mkdir(mode=0o700)
        (tmp_path / "cr" / "c.conf").write_text(
            f"local stratum 1\nallow 10.201.0.0/24\nbindcmdaddress {tmp_path}/cr/s.sock\ncmdport 0\n"
            f"pidfile {tmp_path}/cr/pid\n")
        (tmp_path / "ch" / "c.conf").write_text(
            f"server 10.201.0.1 iburst minpoll -4 maxpoll -4 offset {CHRONY_TOLD_S}\nbindcmdaddress {tmp_path}/ch/s.sock\n"
            f"cmdport 0\nport 0\npidfile {tmp_path}/ch/pid\n")
        log = open(tmp_path / "daemons.log", "w")
        for ns, argv in ((ref, ["ptp4l", "-S", "-i", f"{tag}a", "-f", f"{tmp_path}/m.cfg", "-m"]),
                         (host, ["ptp4l", "-S", "-i", f"{tag}b", "-f", f"{tmp_path}/s.cfg", "-m"]),
                         (ref, ["chronyd", "-x", "-d", "-u", "root", "-f", f"{tmp_path}/cr/c.conf"]),
                         (host, ["chronyd", "-x", "-d", "-u", "root", "-f", f"{tmp_path}/ch/c.conf"])):
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=log, stderr=log))
        yield host, tmp_path
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        for ns in (ref, host):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_bounds_from_real_ptp4l_and_chronyd_through_the_host_path(lab):
    from harness.bench.hosts import HostSession

    ns, tmp = lab
    session = HostSession(HostResource(name="h1", address="netns"), clock_probes=8,
                          transport=NetnsTransport(ns, tmp))
    session.clock_sockets = (f"{tmp}/ch/s.sock", f"{tmp}/ptp-s")
    try:
        session.open()  # agent, time responder, first probe, the clock sources
        deadline = time.monotonic() + 25
        while set(session.clock_sources[0]) != {"chrony", "ptp"} and time.monotonic() < deadline:
            time.sleep(0.5)  # the daemons are still finding their master / source
            session.read_clock_sources()
        readings, absent, _ = session.clock_sources
        assert set(readings) == {"chrony", "ptp"}, (absent, (tmp / "daemons.log").read_text()[-2000:])
        session.sync_clock()
        entry = session.clock_source_table()
    finally:
        session.close()
    ptp, chrony = entry["ptp"], entry["chrony"]
    # One CLOCK_REALTIME on every end, so the truth is known: host minus master is 0 for ptp4l, and -5 ms for
    # chronyd, told its source reads 5 ms ahead. Each bound must hold it; the probe (the harness's own clock)
    # says ~0, so it agrees with ptp4l and disagrees with chronyd beyond both bounds, by the told 5 ms.
    assert abs(ptp["offset_ns"]) <= ptp["width_ns"] and ptp["probe"]["ok"], entry
    assert abs(chrony["offset_ns"] + 5_000_000) <= chrony["width_ns"], entry
    check = chrony["probe"]
    assert not check["ok"] and abs(check["disagreement_ns"] - 5_000_000) <= check["allowed_ns"], entry
    (warning,) = source_warnings([{"host": "h1", "sources": entry}])
    assert warning.startswith("clock of h1: chrony says -4") and "beyond both bounds" in warning


def test_emulated_bench_manifest_sets_chrony_beside_the_probe(tmp_path, run_playbook):
    """The emulated hosts answer `chronyc -c tracking` from their emulated clocks (against this machine's
    realtime) and have no ptp4l: each host's manifest entry has the chrony bound with the probe's beside it."""
    import yaml

    book = tmp_path / "pb.yaml"
    book.write_text(yaml.safe_dump({"name": "t", "bench": "emulated:instant", "seed": 3, "cycles": 1, "steps": [
        {"type": "turnaround", "name": "measure", "cycle_timeout_s": 20, "clock_warmup_s": 0.3}]}))
    result = run_playbook(book, bench="emulated:instant")
    clocks = result.manifest()["clock"]
    assert clocks and all(set(c["sources"]) == {"chrony", "absent"} for c in clocks), clocks
    for c in clocks:
        chrony = c["sources"]["chrony"]
        assert list(c["sources"]["absent"]) == ["ptp"] and c["sources"]["absent"]["ptp"].startswith("no ptp4l answered")
        assert chrony["probe"]["ok"] and chrony["bound_ns"] == abs(chrony["offset_ns"]) + chrony["width_ns"], c
    assert "clock_source_warnings" not in result.summary()["summary"]


def test_a_disagreement_is_a_warning_in_summary_md_and_on_the_console(capsys):
    from types import SimpleNamespace as N

    from harness.finish import console_summary, summary_markdown

    warning = "clock of h1: chrony says -4998.2 µs ± 4.6, the SSH probe -3.1 µs ± 11.6: they disagree by +4995.1 µs"
    ctx = N(run_id="r", playbook=N(name="p"), inventory=N(name="b"), manifest_extra={}, results={}, quiet=False)
    summary = {"status": "ok", "wall_s": 1.0, "faults": 0, "steps": {}, "clock_source_warnings": [warning]}
    assert f"⚠ {warning}" in summary_markdown(ctx, summary)
    console_summary(ctx, N(summary=summary))
    assert "WARNING: clock of h1: chrony says" in capsys.readouterr().err
