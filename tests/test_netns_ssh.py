"""Netns mode over SSH: the harness's HostAgent driver, talking to emulated hosts whose `ip monitor` and
agent probes really run inside the namespaces. Needs root; skipped otherwise."""
import itertools
import os

import pytest

from devices.agent import build_probe_template
from devices.emulated.netns import NetnsPlane, list_netns, netns_available, passthrough_commands
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import profile_from_dict
from devices.emulated.host.server import EmulatedHostServer
from devices.errors import TransportClosed
from devices.hostagent import HostAgent, parse_probe_line
from devices.parsers.nic import parse_ip_monitor_line
from devices.ssh import SshTransport
from devices.timing import Deadline, now_ns

pytestmark = pytest.mark.netns
_UNAVAILABLE = netns_available()
if _UNAVAILABLE:
    pytest.skip(f"network namespaces: {_UNAVAILABLE}", allow_module_level=True)

PROFILE = {
    "name": "netns-ssh",
    "ocs": {"switch": {"dist": "fixed", "ms": 10}, "dark": {"dist": "fixed", "ms": 1}},
    "nic": {"los_clear": {"dist": "fixed", "ms": 1}, "cdr_lock": {"dist": "fixed", "ms": 1},
            "phy_up": {"dist": "fixed", "ms": 3}, "port_active": {"dist": "fixed", "ms": 0},
            "link_down": {"dist": "fixed", "ms": 1}},
    "hosts": {"clock_offset_ms": [0, 0], "drift_ppm": [0, 0]},
    "topology": {"hosts": 2, "nics_per_host": 1, "ocs_size": [2, 2]},
}


def read_until(stream, predicate, seconds=20.0) -> str:
    deadline = Deadline(seconds)
    while True:
        item = stream.readline(deadline)
        assert item is not None, "expected line did not come"
        if predicate(item[1]):
            return item[1]


def wait_until_live(monitor, plane, host: str, netdev: str, seconds: float = 20.0) -> None:
    """`ip monitor` reports nothing from before it subscribed, and a real process starts late on a loaded
    machine: change the link's queue length (a notified change the test does not look at) until the
    monitor reports the link, so the change under test comes after it listens."""
    deadline = Deadline(seconds)
    for i in itertools.count():
        assert not deadline.expired(), "ip monitor never reported a change"
        plane.run_in(host, ["ip", "link", "set", "dev", netdev, "txqueuelen", str(1001 - i % 2)]).wait()
        poll = Deadline(min(0.2, deadline.remaining()))
        while (item := monitor.readline(poll)) is not None:
            if netdev in item[1]:
                return


def test_driver_probes_and_ip_monitor_run_inside_the_namespaces():
    prefix = f"hils{os.getpid() % 100000}"
    with OpticalBench(profile_from_dict(PROFILE), seed=2) as bench, NetnsPlane(bench, prefix) as plane:
        a, b = bench.all_nic_ports()
        with EmulatedHostServer(bench, a.host, extra_commands=passthrough_commands(plane, a.host)) as sa, \
                EmulatedHostServer(bench, b.host, extra_commands=passthrough_commands(plane, b.host)) as sb, \
                SshTransport(sa.resource()) as ta, SshTransport(sb.resource()) as tb:
            agent_a, agent_b = HostAgent(ta), HostAgent(tb)
            agent_a.install()
            agent_b.install()
            monitor = tb.stream("ip -ts monitor link")
            receiver = agent_b.probe_recv(b.netdev, gap_us=20_000)
            template = build_probe_template(a.mac, b.mac, plane.port(a.host, a.netdev).ip,
                                            plane.port(b.host, b.netdev).ip)
            sender = agent_a.probe_send([(a.netdev, template)], interval_us=1000)
            wait_until_live(monitor, plane, b.host, b.netdev)  # else its LOWER_UP can come before it listens

            bench.ocs_apply({a.ocs_tx: b.ocs_rx, b.ocs_tx: a.ocs_rx})
            first = parse_probe_line(read_until(receiver, lambda line: " first " in line))
            read_ns = now_ns()
            assert (first.kind, first.src_mac) == ("first", a.mac)
            active = max(t["t_ns"] for t in bench.ground_truth() if t["stage"] == "port_active")
            epoch = bench.host_clock_params(b.host)["epoch_ns"]
            # Bounds from causality, not speed: the kernel stamped the first probe after the data plane let it
            # through (a's and b's OCS-side veths up, a redirected to b: each change after it was queued) and
            # before the test read the line. A loaded machine starts the real sender late, so its lag behind
            # the physics has no wall-clock bound.
            assert plane.settle()
            opened = max(queued for kind, key, queued, _ in plane.op_log
                         if (kind == "carrier" and key in (a.key, b.key)) or (kind == "redirect" and key == a.key))
            assert max(opened, active - 1_000_000) <= first.host_ns - epoch <= read_ns

            # The real `ip monitor` in B's namespace saw B's veth get carrier.
            line = read_until(monitor, lambda text: b.netdev in text and "LOWER_UP" in text)
            read_ns = now_ns()
            link = parse_ip_monitor_line(line)
            assert link is not None and link.ifname == b.netdev and link.carrier
            phy_up_b = next(t["t_ns"] for t in bench.ground_truth() if t["stage"] == "phy_up" and t["host"] == b.host)
            carrier_b = min(queued for kind, key, queued, _ in plane.op_log if kind == "carrier" and key == b.key)
            # ip monitor's stamp is whole microseconds
            assert max(phy_up_b, carrier_b) - 1_000_000 <= link.stamp_ns() - epoch <= read_ns

            sender.close_stdin()
            # The physics still models the probe stream, so ground truth keeps a first_packet event.
            modelled = [t["t_ns"] for t in bench.ground_truth() if t["stage"] == "first_packet" and t["host"] == b.host]
            # ... after both ends are ACTIVE (and after the modelled sender started, as late as the real one)
            assert modelled and active <= modelled[0] <= now_ns()
            summary = read_until(sender, lambda text: text.startswith("sent "))
            words = summary.split()
            assert words[0] == "sent" and int(words[1]) > 0 and words[2] == "errors"
            receiver.close_stdin()
            with pytest.raises(TransportClosed):
                read_until(receiver, lambda text: False, seconds=20)
            assert receiver.exit_status == 0
            monitor.close()
            receiver.close()
            sender.close()
        assert not plane.errors
    assert not [n for n in list_netns() if n.startswith(prefix)]
