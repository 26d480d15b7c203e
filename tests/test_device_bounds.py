"""Issue 38, reproduction 4: every read from a host is bounded in bytes, lines and time, and says which bound
it met — an endless command output, an endless line, a flood of lines — against the emulated SSH host over
real SSH (the flooding commands are the test's own handlers on that host)."""
from __future__ import annotations

import resource
import threading
import time

import pytest

from devices.emulated.host.context import ChannelGone
from devices.emulated.host.server import EmulatedHostServer
from devices.errors import DeviceError, OutputTooLong, ReadBudget
from devices.ssh import MAX_OUTPUT_BYTES, MAX_STREAM_LINE_BYTES, SshTransport
from devices.timing import Deadline
from harness.bench.readers import MAX_LINES_PER_S, StreamReaders


def _endless(chunk: bytes):
    def handler(ctx, argv):
        try:
            while True:
                ctx.out(chunk)
        except ChannelGone:
            return 0
    return handler


@pytest.fixture(scope="module")
def flooding(bench):
    extra = {"flood": _endless(b"y\n" * 32768), "noline": _endless(b"x" * 65536),
             "lines": _endless(b"1 ens1f0np0 carrier 1 1000\n" * 2000)}
    with EmulatedHostServer(bench, bench.hosts[0], extra_commands=extra) as server:
        with SshTransport(server.resource()) as ssh:
            yield ssh


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_endless_command_output_is_cut_at_the_bound_naming_it(flooding):
    before = _rss_mb()
    started = time.monotonic()
    with pytest.raises(OutputTooLong, match=f"more than {MAX_OUTPUT_BYTES} bytes or .* lines"):
        flooding.run("flood", deadline=Deadline(60))
    assert time.monotonic() - started < 60
    assert _rss_mb() - before < 20 * MAX_OUTPUT_BYTES / 2**20  # bounded by the bound, not by the flood
    assert flooding.run("echo still usable").stdout == "still usable\n"


def test_read_budget_counts_lines_as_well_as_bytes():
    budget = ReadBudget("x", 100, 3)
    budget.take(b"a\nb\n")
    with pytest.raises(OutputTooLong, match="x: more than 100 bytes or 3 lines"):
        budget.take("c\nd\n")
    with pytest.raises(DeviceError):
        ReadBudget("y", 4, 10).take(b"12345")


def _stream_until_end(ssh, command: str, within_s: float = 30.0):
    readers = StreamReaders(start_on_use=True)
    got, reasons, ended = [], [], threading.Event()
    stream = ssh.stream(command)

    def on_end(reason):
        reasons.append(reason)
        ended.set()

    readers.add_lines(stream, lambda recv_ns, lines: got.append(max(map(len, lines))), on_end)
    assert ended.wait(within_s), "the flood was never cut"
    time.sleep(0.2)
    return got, reasons


def test_a_line_without_end_is_cut_and_ends_the_stream_naming_the_bound(flooding):
    got, reasons = _stream_until_end(flooding, "noline")
    assert len(reasons) == 1 and f"longer than {MAX_STREAM_LINE_BYTES} characters" in reasons[0]
    assert got == []  # nothing of the over-long line was delivered


def test_a_flood_of_lines_ends_the_stream_naming_the_rate_bound(flooding):
    got, reasons = _stream_until_end(flooding, "lines")
    assert len(reasons) == 1 and f"more than {MAX_LINES_PER_S} lines" in reasons[0], reasons


def test_a_host_time_beyond_64_bits_is_a_fault_of_that_line_and_the_record_is_kept(tmp_path, monkeypatch, capsys):
    """Issue 38, reproduction 5: a watch line stamped beyond 2**64 ns crashed the record writer (traceback,
    record lost, the pending note left to block every later run). Now: that line is the host's fault, the run's
    record is written, and the switch's note is cleared."""
    import json

    import yaml

    from devices.emulated.bench import EmulatedBench
    from devices.emulated.profile import profile_from_dict
    from harness.cli import main
    from harness.config import load_inventory
    from harness.recovery import read_pending

    monkeypatch.setenv("OCS_HIL_LOCK_DIR", str(tmp_path / "locks"))
    profile = {"name": "huge", "ocs": {"switch": {"dist": "fixed", "ms": 2}},
               "topology": {"hosts": 2, "nics_per_host": 1, "ocs_size": [4, 4]}}
    with EmulatedBench(profile_from_dict(profile), seed=1, workdir=tmp_path / "bench") as bench:
        for server in bench.host_servers.values():
            watch = server.agent_commands["watch"]

            def bad_then_watch(ctx, argv, watch=watch):
                target = next(a for a in argv[1:] if not a.startswith("-") and not a.isdigit())
                ctx.out(f"{2**64 + 5} {target.split('=')[0]} carrier 1 1000\n")
                return watch(ctx, argv)
            server.agent_commands["watch"] = bad_then_watch
        pb = tmp_path / "pb.yaml"
        pb.write_text(yaml.safe_dump({"name": "huge", "cycles": 2, "steps": [
            {"type": "turnaround", "clock_warmup_s": 0.2, "cycle_timeout_s": 10}]}))
        code = main(["run", str(pb), "--bench", str(bench.inventory_path), "--out", str(tmp_path / "run"), "-q"])
        err = capsys.readouterr().err
        assert "Traceback" not in err and code in (0, 1), (code, err[-2000:])
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert "out of range 0..2**63-1" in json.dumps(summary) or "out of range 0..2**63-1" in \
            (tmp_path / "run" / "observations.jsonl").read_text()
        assert read_pending(load_inventory(bench.inventory_path).ocs["ocs1"]) is None
