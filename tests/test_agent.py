"""The host agent without namespaces: probe framing against scapy, parsers against the emulator's formats,
the time responder and the watcher on the loopback interface, and its stdlib-only / Python 3.8 contract."""
import ast
import hashlib
import importlib.util
import queue
import re
import struct
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from devices.agent import AGENT_FILE, PROBE_UDP_SPORT, agent_path, agent_source, build_probe_template
from devices.emulated import formats
from devices.emulated.nic import NicSnapshot
from devices.hostagent import parse_counter_line
from devices.parsers.nic import parse_ethtool_module

spec = importlib.util.spec_from_file_location("hilagent", AGENT_FILE)
hilagent = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hilagent)

MAC_A, MAC_B = "0c:42:a1:00:00:01", "0c:42:a1:01:00:01"


def scapy_frame(port: int, dqpn: int, seq: int, payload: bytes) -> bytes:
    """scapy's own build of a probe with this PSN and payload (scapy computes IP checksum and ICRC)."""
    return bytes(Ether(src=MAC_A, dst=MAC_B) / IP(src="198.18.0.1", dst="198.18.0.2", id=1, ttl=64)
                 / UDP(sport=PROBE_UDP_SPORT, dport=port, chksum=0)
                 / BTH(opcode=4, pkey=0xFFFF, dqpn=dqpn, psn=seq & 0xFFFFFF) / Raw(payload))


@settings(max_examples=60, deadline=None)
@given(seq=st.integers(0, 2**64 - 1), tx_ns=st.integers(0, 2**64 - 1), port=st.sampled_from([4791, 5791]),
       dqpn=st.integers(0, 2**24 - 1))
def test_incremental_icrc_is_byte_identical_to_scapy(seq, tx_ns, port, dqpn):
    template = build_probe_template(MAC_A, MAC_B, "198.18.0.1", "198.18.0.2", port, dqpn)
    payload = struct.pack("!QQ", seq, tx_ns)
    agent_frame = hilagent.ProbeLayout(template).frame(seq, payload)
    assert agent_frame == scapy_frame(port, dqpn, seq, payload)


def test_template_is_a_74_byte_rc_send_only_frame_with_zero_udp_checksum():
    template = build_probe_template(MAC_A, MAC_B, "198.18.0.1", "198.18.0.2", 4791, 17)
    pkt = Ether(template)
    assert len(template) == 74
    assert (pkt[BTH].opcode, pkt[BTH].dqpn, pkt[BTH].psn, pkt[UDP].chksum, pkt[UDP].dport) == (4, 17, 0, 0, 4791)
    assert (pkt.src, pkt.dst, pkt[IP].src, pkt[IP].dst) == (MAC_A, MAC_B, "198.18.0.1", "198.18.0.2")


@pytest.mark.parametrize("port,dqpn", [(4791, 1), (4791, 0xABCDEF), (6000, 5)])
def test_stdlib_frame_builder_matches_scapy_template(port, dqpn):
    ours = hilagent.build_probe_frame(MAC_A, MAC_B, "198.18.0.1", "198.19.255.254", port, dqpn)
    assert ours == build_probe_template(MAC_A, MAC_B, "198.18.0.1", "198.19.255.254", port, dqpn)


def test_icrc_depends_on_psn_and_payload():
    layout = hilagent.ProbeLayout(build_probe_template(MAC_A, MAC_B, "198.18.0.1", "198.18.0.2"))
    frames = {layout.frame(seq, struct.pack("!QQ", seq, 7))[-4:] for seq in range(50)}
    assert len(frames) == 50


def test_probe_layout_rejects_other_frames():
    template = build_probe_template(MAC_A, MAC_B, "198.18.0.1", "198.18.0.2")
    with pytest.raises(ValueError, match="Ether/IPv4/UDP/BTH"):
        hilagent.ProbeLayout(template + b"\0")
    with pytest.raises(ValueError, match="IPv4"):
        hilagent.ProbeLayout(template[:12] + b"\x86\xdd" + template[14:])


def test_probe_parser_reads_source_and_sequence_and_filters_the_port():
    layout = hilagent.ProbeLayout(build_probe_template(MAC_A, MAC_B, "198.18.0.1", "198.18.0.2", 5000))
    frame = layout.frame(123456, struct.pack("!QQ", 123456, 99))
    assert hilagent.ProbeParser(5000)(frame) == (MAC_A, 123456)
    assert hilagent.ProbeParser(4791)(frame) is None
    assert hilagent.ProbeParser(5000)(frame[:40]) is None


@pytest.mark.parametrize("los,lol", [(False, False), (True, True), (True, False), (False, True)])
def test_module_flags_agree_with_the_project_parser(los, lol):
    text = formats.ethtool_module(NicSnapshot(rx_los=los, rx_lol=lol))
    expected = parse_ethtool_module(text)
    assert hilagent.parse_module_flags(text) == {"rx_los": str(int(expected.rx_los)),
                                                 "rx_lol": str(int(expected.rx_lol)),
                                                 "module_state": expected.module_state}
    assert (expected.rx_los, expected.rx_lol) == (los, lol)


def test_watch_specs():
    assert hilagent.parse_watch_spec("ens1f0np0=mlx5_0/1") == ("ens1f0np0", "mlx5_0", 1)
    assert hilagent.parse_watch_spec("eth0") == ("eth0", None, None)
    for bad in ("=mlx5_0/1", "eth0=mlx5_0", "eth0=mlx5_0/x", "a/b"):
        with pytest.raises(Exception, match="expected"):
            hilagent.parse_watch_spec(bad)
    assert hilagent._word_after_code("4: ACTIVE") == "ACTIVE"
    assert hilagent._word_after_code("5: LinkUp") == "LinkUp"


def test_install_path_is_content_addressed():
    digest = hashlib.sha256(AGENT_FILE.read_bytes()).hexdigest()[:12]
    assert agent_path() == f"~/.cache/ocs-hil/hilagent-{digest}.py"
    assert agent_source() == AGENT_FILE.read_text()


def test_agent_is_stdlib_only_and_python38_syntax():
    tree = ast.parse(agent_source(), feature_version=(3, 8))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def _lines(proc) -> "queue.SimpleQueue[str]":
    out: queue.SimpleQueue = queue.SimpleQueue()

    def pump():
        for line in proc.stdout:
            out.put(line.rstrip("\n"))
        out.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return out


def test_timesrv_answers_each_token_with_the_current_time():
    proc = subprocess.Popen([sys.executable, "-u", str(AGENT_FILE), "timesrv"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    lines = _lines(proc)
    try:
        for token in ("a1", "b2", "c3"):
            before = time.time_ns()
            proc.stdin.write(token + "\n")
            proc.stdin.flush()
            reply = lines.get(timeout=20)
            after = time.time_ns()
            word, stamp = reply.split()
            assert word == token and before <= int(stamp) <= after
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=20) == 0
    assert lines.get(timeout=5) is None


def test_watch_reports_initial_values_notes_missing_sources_and_stops_on_stdin_eof():
    proc = subprocess.Popen([sys.executable, "-u", str(AGENT_FILE), "watch", "--interval-us", "2000",
                             "--ethtool-interval-us", "0", "lo=nosuchdev/1"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = _lines(proc)
    before = time.time_ns()
    first = [lines.get(timeout=20).split() for _ in range(2)]
    proc.stdin.close()
    assert proc.wait(timeout=20) == 0
    by_field = {f[2]: f for f in first}
    assert set(by_field) == {"carrier", "operstate"}
    carrier = open("/sys/class/net/lo/carrier").read().strip()
    operstate = open("/sys/class/net/lo/operstate").read().strip()
    assert by_field["carrier"][1:] == ["lo", "carrier", carrier, "0"]
    assert by_field["operstate"][1:] == ["lo", "operstate", operstate, "0"]
    assert all(before <= int(f[0]) <= time.time_ns() for f in first)
    stderr = proc.stderr.read()
    assert "phys_state unavailable" in stderr and "state unavailable" in stderr


def test_the_agent_s_declared_minimum_python_is_what_vermin_reads_in_it():
    """vermin (an independent reading of every module, member and syntax the file uses) finds the oldest Python
    that runs the agent; the agent's own check refuses older ones with exactly that bound."""
    done = subprocess.run([sys.executable, "-c", "import sys; from vermin import main; sys.exit(main())", "--no-tips",
                           str(AGENT_FILE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = re.search(r"Minimum required versions: (\d+)\.(\d+)", done.stdout)
    assert found and (int(found[1]), int(found[2])) == hilagent.MIN_PYTHON, done.stdout


def test_an_older_python_gets_one_line_naming_the_versions_not_a_traceback():
    """As a RHEL 8 host's python3 (3.6.8) would run it: the agent's first check, before anything else runs."""
    old = ("import runpy, sys; sys.version_info = (3, 6, 8, 'final', 0); sys.version = '3.6.8 (default)'; "
           f"sys.argv = ['hilagent', 'version']; runpy.run_path({str(AGENT_FILE)!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", old], capture_output=True, text=True, timeout=20)
    assert done.returncode == 3 and done.stdout == ""
    assert done.stderr == f"hilagent: needs Python 3.7 or newer; {sys.executable} is 3.6.8\n"
    done = subprocess.run([sys.executable, str(AGENT_FILE), "version"], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0 and done.stdout == "%d.%d.%d\n" % sys.version_info[:3]


def test_bad_arguments_exit_with_usage_not_traceback():
    done = subprocess.run([sys.executable, str(AGENT_FILE), "watch", "--interval-us", "0", "lo"],
                          capture_output=True, text=True, timeout=20)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    done = subprocess.run([sys.executable, str(AGENT_FILE), "probe-send", "--iface", "lo", "--interval-us", "10",
                           "--template", "zz"], capture_output=True, text=True, timeout=20)
    assert done.returncode != 0 and "hex" in done.stderr and "Traceback" not in done.stderr
    for args, says in ((["--iface", "lo", "--iface", "eth9", "--template", "00"], "one --template per --iface"),
                       (["--iface", "lo", "--iface", "lo", "--template", "00", "--template", "00"], "given twice"),
                       (["--iface", "lo", "--iface", "eth9", "--dst-mac", "02:00:00:00:00:01"], "one --iface")):
        done = subprocess.run([sys.executable, str(AGENT_FILE), "probe-send", "--interval-us", "10", *args],
                              capture_output=True, text=True, timeout=20)
        assert done.returncode != 0 and says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_carrier_flip_between_two_polls_is_reported_from_the_change_counter(tmp_path):
    carrier, changes = tmp_path / "carrier", tmp_path / "carrier_changes"
    carrier.write_text("1\n")
    changes.write_text("4\n")
    field = hilagent.SysfsField("eth0", "carrier", str(carrier), str, str(changes))
    poll = lambda start, end: hilagent.poll_lines(field, field.read(), field.changes_since_last(), start, end)  # noqa: E731
    assert poll(1_000, 1_010) == ["1010 eth0 carrier 1 0"]  # the initial value
    assert poll(2_000, 2_010) == []  # nothing happened
    changes.write_text("6\n")  # down and up again before this poll read it
    assert poll(3_000, 3_010) == ["3010 eth0 carrier 0 1010", "3010 eth0 carrier 1 1010"]
    carrier.write_text("0\n")
    changes.write_text("7\n")
    assert poll(4_000, 4_010) == ["4010 eth0 carrier 0 1010"]
    no_counter = hilagent.SysfsField("eth0", "carrier", str(carrier), str, str(tmp_path / "absent"))
    assert no_counter.changes_since_last() == 0  # an old kernel: polling alone


@pytest.mark.parametrize("before, within_one_poll, printed", [
    ("1", ["0"], ["0"]),
    ("1", ["0", "1"], ["0", "1"]),  # down and up again: carrier_changes +2, the value as before
    ("1", ["0", "1", "0", "1"], ["0", "1"]),  # +4: one flap shown
    ("1", ["0", "1", "0"], ["0", "1", "0"]),  # +3: changed, and the flap before it
    ("0", ["1", "0", "1", "0", "1"], ["1", "0", "1"]),  # +5: changed, one flap shown
])
def test_both_agents_print_the_same_carrier_lines_for_changes_within_one_poll(tmp_path, before, within_one_poll,
                                                                               printed):
    """The real agent reads the value and carrier_changes; the emulated one sees every change of the tick: given the
    same changes between two polls, both print the same carrier values."""
    from types import SimpleNamespace

    from devices.emulated.host.agent import _WatchStream
    from devices.emulated.nic import NicChange

    carrier, changes = tmp_path / "carrier", tmp_path / "carrier_changes"
    carrier.write_text(before + "\n")
    changes.write_text("10\n")
    field = hilagent.SysfsField("eth0", "carrier", str(carrier), str, str(changes))
    first = hilagent.poll_lines(field, field.read(), field.changes_since_last(), 0, 10)
    assert first == ["10 eth0 carrier %s 0" % before]
    carrier.write_text(within_one_poll[-1] + "\n")
    changes.write_text("%d\n" % (10 + len(within_one_poll)))
    real = hilagent.poll_lines(field, field.read(), field.changes_since_last(), 1_000, 1_010)

    out = []
    ctx = SimpleNamespace(host="h1", out=out.append, server=SimpleNamespace(watch_stalled_until_ns=0),
                          bench=SimpleNamespace(host_time=lambda host, t: t))
    stream = _WatchStream(ctx, {"eth0": ("carrier",)}, 200_000, 100_000_000)
    stream.last[("eth0", "carrier")] = stream.live[("eth0", "carrier")] = before
    tick = 10_000_000
    stream.write([(tick, NicChange(tick - 100_000 + k, "h1", "eth0", "carrier", value))
                  for k, value in enumerate(within_one_poll)])
    emulated = "".join(out).splitlines()
    assert [line.split()[3] for line in real] == [line.split()[3] for line in emulated] == printed
    assert {line.split()[0] for line in real} == {"1010"} and {line.split()[0] for line in emulated} == {str(tick)}


def test_an_ib_link_down_and_retrained_between_two_polls_is_reported_from_link_downed(tmp_path):
    """The IB state reads ACTIVE at both polls, but the port's PortLinkDownedCounter moved: it went DOWN and
    trained again in between (a swap faster than the poll), so port_active is not lost. The counter is 8 bits."""
    state, downed = tmp_path / "state", tmp_path / "link_downed"
    state.write_text("4: ACTIVE\n")
    downed.write_text("255\n")
    field = hilagent.SysfsField("eth0", "state", str(state), hilagent._word_after_code, str(downed))
    poll = lambda start, end: hilagent.poll_lines(field, field.read(), field.changes_since_last(), start, end)  # noqa: E731
    assert poll(1_000, 1_010) == ["1010 eth0 state ACTIVE 0"]
    assert poll(2_000, 2_010) == []
    downed.write_text("0\n")  # wrapped: one more link-down
    assert poll(3_000, 3_010) == ["3010 eth0 state DOWN 1010", "3010 eth0 state ACTIVE 1010"]
    state.write_text("1: DOWN\n")
    downed.write_text("1\n")
    assert poll(4_000, 4_010) == ["4010 eth0 state DOWN 1010"]


def test_counters_read_both_data_counters_per_port_and_name_a_missing_one(tmp_path):
    counters = tmp_path / "mlx5_0" / "ports" / "1" / "counters"
    counters.mkdir(parents=True)
    (counters / "port_xmit_data").write_text("123456789012\n")
    (counters / "port_rcv_data").write_text("42\n")
    files = hilagent.open_counters([("mlx5_0", "1")], root=str(tmp_path))
    before = time.time_ns()
    (line,) = hilagent.sample_counters(files)
    parsed = parse_counter_line(line)
    assert (parsed.port, parsed.xmit_words, parsed.rcv_words) == ("mlx5_0/1", 123456789012, 42)
    assert before <= parsed.host_ns - parsed.read_ns <= parsed.host_ns <= time.time_ns()
    with pytest.raises(SystemExit, match="mlx5_1/1"):
        hilagent.open_counters([("mlx5_1", "1")], root=str(tmp_path))
    done = subprocess.run([sys.executable, str(AGENT_FILE), "counters", "--interval-us", "1000", "mlx5_0"],
                          capture_output=True, text=True, timeout=20)
    assert done.returncode != 0 and "RDMADEV/PORT" in done.stderr and "Traceback" not in done.stderr
