"""The emulated host's tools over real SSH: what each tool prints agrees with the bench's NIC state and
ground truth, in the real formats (parsed with devices/parsers), and the command registry is extensible."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import time

import pytest

from devices.emulated.physics import OpticalBench
from devices.emulated.profile import profile_from_dict
from devices.emulated.host.server import EmulatedHostServer
from devices.parsers.gpu import parse_nvidia_smi_csv, parse_nvidia_timestamp
from devices.parsers.nic import (parse_carrier, parse_ethtool, parse_ethtool_module, parse_ib_phys_state,
                                 parse_ib_rate, parse_ib_state, parse_ip_link_oneline, parse_ip_monitor_line,
                                 parse_mlxlink, parse_operstate, parse_rdma_link, parse_rdma_link_json,
                                 parse_sysfs_int)
from devices.ssh import SshTransport
from devices.timing import Deadline


def _connect(bench, nic, on: bool) -> None:
    if on:
        bench.ocs_apply({nic.ocs_tx: nic.ocs_rx})
    else:
        bench.ocs_apply({}, removes=[nic.ocs_tx])
    assert bench.wait_idle(10)


def _tools_agree_with_snapshot(ssh, bench, host, nic) -> None:
    snap = bench.nic_snapshot(host, nic.netdev)
    ib = f"/sys/class/infiniband/{nic.rdma_dev}/ports/{nic.rdma_port}"
    net = f"/sys/class/net/{nic.netdev}"
    assert parse_ib_state(ssh.run(f"cat {ib}/state", check=True).stdout).name == snap.ib_state
    assert parse_ib_phys_state(ssh.run(f"cat {ib}/phys_state", check=True).stdout).name == snap.phys_state
    assert parse_ib_rate(ssh.run(f"cat {ib}/rate", check=True).stdout).mbps == snap.speed_mbps
    assert parse_sysfs_int(ssh.run(f"cat {ib}/counters/link_downed", check=True).stdout) == snap.link_downed
    assert parse_carrier(ssh.run(f"cat {net}/carrier", check=True).stdout) == snap.carrier
    assert parse_operstate(ssh.run(f"cat {net}/operstate", check=True).stdout) == snap.operstate
    assert parse_sysfs_int(ssh.run(f"cat {net}/carrier_changes", check=True).stdout) == \
        snap.carrier_up_count + snap.carrier_down_count
    links = {link.ifname: link for link in parse_ip_link_oneline(ssh.run("ip -o link", check=True).stdout)}
    assert (links[nic.netdev].carrier, links[nic.netdev].operstate, links[nic.netdev].mac) == \
        (snap.carrier, snap.operstate.upper(), nic.mac)
    for command, parse in (("rdma link", parse_rdma_link), ("rdma -j link", parse_rdma_link_json)):
        rdma = {r.netdev: r for r in parse(ssh.run(command, check=True).stdout)}[nic.netdev]
        assert (rdma.dev, rdma.port, rdma.state, rdma.phys_state) == (nic.rdma_dev, nic.rdma_port, snap.ib_state,
                                                                      snap.phys_state)
    assert parse_ethtool(ssh.run(f"ethtool {nic.netdev}", check=True).stdout).link_detected == snap.carrier
    assert (parse_mlxlink(ssh.run(f"mlxlink -d {nic.rdma_dev}", check=True).stdout).link_up) \
        == (snap.phys_state == "LinkUp")


def test_every_tool_agrees_with_the_bench_before_and_after_link_up(ssh, bench, server):
    host = server.host_name
    nic = bench.nic_ports(host)[0]
    for port in bench.nic_ports(host):
        _tools_agree_with_snapshot(ssh, bench, host, port)
    assert bench.nic_snapshot(host, nic.netdev).ib_state == "DOWN"
    _connect(bench, nic, True)  # loop the port's TX back to its own RX
    assert bench.nic_snapshot(host, nic.netdev).ib_state == "ACTIVE"
    _tools_agree_with_snapshot(ssh, bench, host, nic)
    _connect(bench, nic, False)
    assert bench.nic_snapshot(host, nic.netdev).carrier_down_count == 1
    _tools_agree_with_snapshot(ssh, bench, host, nic)


def test_ethtool_module_flags_latch_until_read(ssh, bench, server):
    nic = bench.nic_ports(server.host_name)[1]
    _connect(bench, nic, True)
    read = lambda: parse_ethtool_module(ssh.run(f"ethtool -m {nic.netdev}", check=True).stdout)  # noqa: E731
    assert not read().rx_los
    _connect(bench, nic, False)
    _connect(bench, nic, True)  # light was lost and is back: LOS now clear, but latched
    assert not bench.nic_snapshot(server.host_name, nic.netdev).rx_los
    first, second = read(), read()
    assert first.rx_los and first.rx_lol
    assert not second.rx_los and not second.rx_lol  # clear-on-read
    assert second.rx_power_dbm[0] == pytest.approx(bench.nic_snapshot(server.host_name, nic.netdev).rx_power_dbm,
                                                   abs=0.006)
    _connect(bench, nic, False)


def test_ip_monitor_stamps_are_host_time_of_the_true_change(ssh, bench, server):
    host = server.host_name
    nic = bench.nic_ports(host)[0]
    with ssh.stream("ip -ts monitor link") as monitor:
        assert monitor.readline(Deadline(0.3)) is None  # silent until something changes
        _connect(bench, nic, True)
        events = []
        while not events or events[-1].operstate != "UP":  # carrier up (phy_up), operstate UP (port_active)
            item = monitor.readline(Deadline(10))
            assert item is not None, "no link event"
            event = parse_ip_monitor_line(item[1])
            if event is not None:
                events.append(event)
    truth = {(g["stage"]): g["t_ns"] for g in bench.ground_truth() if g["port"] == nic.netdev and g["host"] == host}
    # One RTM_NEWLINK per instant: the instant profile brings the carrier and the operstate up together.
    assert len(events) == (1 if truth["phy_up"] == truth["port_active"] else 2)
    assert all(e.ifname == nic.netdev and e.carrier for e in events)
    assert events[0].stamp_ns() == bench.host_time(host, truth["phy_up"]) // 1000 * 1000
    assert events[-1].stamp_ns() == bench.host_time(host, truth["port_active"]) // 1000 * 1000
    _connect(bench, nic, False)


def test_unknown_commands_answer_like_sh(ssh):
    result = ssh.run("ibv_rc_pingpong -d mlx5_0")  # an rdma-core tool the emulated host does not have
    assert (result.exit_status, result.stdout, result.stderr) == (127, "", "sh: 1: ibv_rc_pingpong: not found\n")
    assert ssh.run("false || echo fallback").stdout == "fallback\n"
    assert ssh.run("false && echo never; echo after").stdout == "after\n"


def test_upload_into_the_virtual_file_system(ssh, server):
    program = "import sys\nprint('hilagent', sys.argv)\n" * 200
    path = "~/.cache/ocs-hil/hilagent-0123456789ab.py"
    upload = ssh.run(f"mkdir -p ~/.cache/ocs-hil && cat > {path}", stdin=program)
    assert (upload.exit_status, upload.stdout) == (0, "")
    assert ssh.run(f"cat {path}").stdout == program
    digest = hashlib.sha256(program.encode()).hexdigest()
    assert ssh.run(f"sha256sum {path}").stdout == f"{digest}  {server.home}/.cache/ocs-hil/hilagent-0123456789ab.py\n"
    refused = ssh.run("cat > /nowhere/x.py", stdin="x")
    assert refused.exit_status == 2 and "Directory nonexistent" in refused.stderr
    missing = ssh.run("python3 -u ~/.cache/ocs-hil/absent.py timesrv")
    assert missing.exit_status == 2 and "No such file or directory" in missing.stderr


def test_nvidia_smi_query(ssh, bench, server):
    fields = ["index", "name", "memory.used", "utilization.gpu", "timestamp"]
    out = ssh.run(f"nvidia-smi --query-gpu={','.join(fields)} --format=csv,noheader,nounits", check=True).stdout
    query = parse_nvidia_smi_csv(out, fields, header=False)
    assert query.column("index") == list(range(len(server.gpus)))
    with_header = parse_nvidia_smi_csv(ssh.run("nvidia-smi --query-gpu=memory.total --format=csv -i 1").stdout)
    assert with_header.units == ("MiB",) and with_header.column("memory.total") == [server.gpus[1].memory_total_mib]
    bad = ssh.run("nvidia-smi --query-gpu=index,bogus --format=csv")
    assert bad.exit_status == 2 and 'Field "bogus" is not a valid field to query.' in bad.stdout


def test_nvidia_smi_loop_queries_again_an_interval_after_each_query(ssh, bench, server):
    """`-lms N`: the header once, then one block of every GPU per query, each stamped with its host time (ms,
    local) when it was made; the next query no earlier than N ms after; the loop ends with the channel."""
    from devices.emulated.formats import nvidia_timestamp

    host, gpus = server.host_name, len(server.gpus)
    before = nvidia_timestamp(bench.host_clock_ns(host))
    with ssh.stream("nvidia-smi --query-gpu=timestamp,index,utilization.gpu --format=csv,nounits -lms 50") as loop:
        lines = [loop.readline(Deadline(10)) for _ in range(1 + 3 * gpus)]
        after = nvidia_timestamp(bench.host_clock_ns(host))
    assert None not in lines
    text = [line for _, line in lines]
    assert text[0] == "timestamp, index, utilization.gpu [%]" and text[0] not in text[1:]
    blocks = [parse_nvidia_smi_csv("\n".join(text[:1] + text[1 + k * gpus:1 + (k + 1) * gpus])) for k in range(3)]
    stamps = []
    for block in blocks:
        assert block.column("index") == list(range(gpus)) and len(set(block.column("timestamp"))) == 1
        stamps.append(block.column("timestamp")[0])
    assert before <= stamps[0] < stamps[1] < stamps[2] <= after
    ms = [parse_nvidia_timestamp(s) // 1_000_000 for s in stamps]
    assert all(b - a >= 50 for a, b in zip(ms, ms[1:])), stamps
    streams = server.agent_streams()
    deadline = Deadline(10)
    while any(k[1].startswith("nvidia-smi-loop") and v for k, v in streams._routes.items()):
        assert not deadline.expired(), "the loop outlived its channel"
        time.sleep(0.01)
    assert ssh.run("nvidia-smi --query-gpu=index --format=csv -lms 0").exit_status == 2


def test_command_registry_extends_and_overrides(bench):
    calls = []

    def netns_exec(ctx, argv):
        calls.append((ctx.host, argv))
        ctx.out(f"ran {' '.join(argv[1:])} in {ctx.host}\n")
        return 0

    def fallback(ctx, argv):
        ctx.err(f"passthrough: {ctx.command}\n")
        return 42

    extra = {"netns-exec": netns_exec, "date": lambda ctx, argv: (ctx.out("frozen\n"), 0)[1], "*": fallback}
    with EmulatedHostServer(bench, bench.hosts[1], extra_commands=extra) as server, \
            SshTransport(server.resource()) as ssh:
        assert ssh.run("netns-exec ip link").stdout == f"ran ip link in {bench.hosts[1]}\n"
        assert ssh.run("date +%s.%N").stdout == "frozen\n"
        other = ssh.run("tc qdisc show")
        assert (other.exit_status, other.stderr) == (42, "passthrough: tc qdisc show\n")
        assert ssh.run("cat /sys/class/net/ens1f0np0/operstate").stdout == "down\n"  # defaults untouched
    assert calls == [(bench.hosts[1], ["netns-exec", "ip", "link"])]


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client binary on this machine")
def test_stock_openssh_client_reads_sysfs(server, bench):
    command = ["ssh", "-F", "/dev/null", "-i", str(server.client_key_path), "-o",
               f"UserKnownHostsFile={server.known_hosts_path}", "-o", "StrictHostKeyChecking=yes", "-o",
               "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-p", str(server.port), f"{server.user}@127.0.0.1"]
    nic = bench.nic_ports(server.host_name)[0]
    ok = subprocess.run(command + [f"cat /sys/class/infiniband/{nic.rdma_dev}/ports/1/state"], capture_output=True,
                        text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert ok.returncode == 0, ok.stderr
    assert parse_ib_state(ok.stdout).name == bench.nic_snapshot(server.host_name, nic.netdev).ib_state
    missing = subprocess.run(command + ["no-such-tool"], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
    assert missing.returncode == 127 and "sh: 1: no-such-tool: not found" in missing.stderr


def test_inventory_entry_names_everything_a_client_needs(server, bench):
    entry = server.inventory_entry(ocs="ocs7")
    resource = server.resource()
    assert (entry["address"], entry["port"], entry["user"]) == ("127.0.0.1", server.port, server.user)
    assert entry["identity_file"] == str(server.client_key_path) == resource.identity_file
    assert entry["known_hosts"] == str(server.known_hosts_path) == resource.known_hosts
    assert not resource.strict_host_key
    assert server.known_hosts_path.read_text().startswith(f"[127.0.0.1]:{server.port} ssh-ed25519 ")
    assert (server.client_key_path.stat().st_mode & 0o777) == 0o600
    assert [(n["netdev"], n["rdma_dev"], n["tx"], n["rx"], n["ocs"]) for n in entry["nics"]] == \
        [(m.netdev, m.rdma_dev, m.ocs_tx, m.ocs_rx, "ocs7") for m in bench.nic_ports(server.host_name)]


def test_one_carrier_loss_is_one_ip_monitor_event(ssh, bench, server):
    host = server.host_name
    nic = bench.nic_ports(host)[1]
    _connect(bench, nic, True)
    with ssh.stream("ip -ts -o monitor link") as monitor:  # -o: one line per event
        assert monitor.readline(Deadline(0.3)) is None
        _connect(bench, nic, False)
        item = monitor.readline(Deadline(10))
        assert item is not None, "no link event"
        event = parse_ip_monitor_line(item[1])
        assert (event.ifname, event.carrier, event.operstate, "NO-CARRIER" in event.flags) == \
            (nic.netdev, False, "DOWN", True)
        assert monitor.readline(Deadline(0.3)) is None  # and nothing more: the kernel sends one RTM_NEWLINK


def test_pinned_tool_versions_reach_the_ssh_path():
    profile = profile_from_dict({"name": "old-tools", "nic": {"los_clear": {"dist": "fixed", "ms": 0}},
                                 "tools": {"ethtool": "5.16", "iproute2": "5.4", "perftest": "23.04"}})
    with OpticalBench(profile, seed=1) as bench, EmulatedHostServer(bench, bench.hosts[0]) as server, \
            SshTransport(server.resource()) as ssh:
        nic = bench.nic_ports(bench.hosts[0])[0]
        assert ssh.run("ethtool --version", check=True).stdout == "ethtool version 5.16\n"
        module = parse_ethtool_module(ssh.run(f"ethtool -m {nic.netdev}", check=True).stdout)
        assert module.rx_los is None and module.module_state == "ModuleReady"  # 5.16: Module State, no LOS
        (link,) = [x for x in parse_rdma_link(ssh.run("rdma link", check=True).stdout) if x.netdev == nic.netdev]
        assert ssh.run("rdma link", check=True).stdout.startswith("0/1: ")  # iproute2 < 5.5
        assert link.dev == nic.rdma_dev
        assert "iproute2-5.4" in ssh.run("ip -V", check=True).stdout
