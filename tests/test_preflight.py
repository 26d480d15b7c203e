"""Bench discovery and preflight (harness/preflight.py): `nvidia-smi topo -m` against a real capture, the fibre
map through the OCS on emulated benches cabled right and deliberately wrong (ground truth: the physics' real
cabling), the draft inventory that `harness validate` accepts, and the run that stops before the switch."""
from __future__ import annotations

import logging
from pathlib import Path

import paramiko
import pytest
import yaml

from devices.emulated.bench import EmulatedBench
from devices.emulated.formats import EmulatedGpu, nvidia_smi_topo
from devices.parsers.gpu import parse_nvidia_smi_topo
from devices.protocols import CommandResult
from devices.timing import CommandTiming
from harness import preflight
from harness.cli import main
from harness.config import load_inventory

REAL_TOPO = Path(__file__).parent / "data" / "real" / "nvidia-smi-topo" / "a100-8gpu-10nic-nv12-tabs.txt"
ORIGINAL = {1: 18, 3: 20}  # cross-connects found before the check: must be there after it
logging.getLogger("paramiko").setLevel(logging.CRITICAL)


def _real_topo() -> str:
    return REAL_TOPO.read_text().partition("\n")[2]


class _Iproute2Host:
    """A host's iproute2 answering from real captures: JSON only when its release has `-j`."""

    def __init__(self, has_json: bool):
        self.has_json, self.commands = has_json, []

    def run(self, command, *, deadline, check):
        self.commands.append(command)
        tool, name = {"ip -j link": ("ip-j-link", "netplan-laptop-ip-d-j-addr-fixture.txt"),
                      "ip -o link": ("ip-link", "bond-vlans-fusioninventory640.txt"),
                      "rdma link": ("rdma-link", "old-form-sriov-vf-spiderpool.txt")}.get(command, (None, None))
        if tool is None or (" -j " in command and not self.has_json):
            return CommandResult(command, 255, "", 'Option "-j" is unknown\n', CommandTiming(0, 0))
        text = (Path(__file__).parent / "data" / "real" / tool / name).read_text().partition("\n")[2]
        return CommandResult(command, 0, text, "", CommandTiming(0, 0))


def test_hosts_are_read_through_iproute2_json_where_it_has_it_and_text_where_not():
    new, old = _Iproute2Host(has_json=True), _Iproute2Host(has_json=False)
    assert [x.ifname for x in preflight._links(new, 1.0)] == ["lo", "enp0s31f6", "wlan0", "wg0", "wwan0", "tun0"]
    assert new.commands == ["ip -j link"]
    assert [x.ifname for x in preflight._links(old, 1.0)][:3] == ["lo", "eth0", "eth1"]
    assert [(r.dev, r.port, r.netdev) for r in preflight._rdma_links(old, 1.0)] == [("mlx5_3", 1, "eth0")]
    assert old.commands == ["ip -j link", "ip -o link", "rdma -j link", "rdma link"]


class _Rendezvous(_Iproute2Host):
    """A host whose first command returns only once every host is inside theirs (a serial probe never gets
    there: BrokenBarrierError), and then only after the next host in inventory order has finished."""

    def __init__(self, barrier, done, after):
        super().__init__(has_json=True)
        self.barrier, self.done, self.after = barrier, done, after

    def run(self, command, *, deadline=None, check=False):
        if not self.commands:
            self.barrier.wait(timeout=20)
            if self.after is not None:
                assert self.after.wait(timeout=20)
        result = super().run(command, deadline=deadline, check=check)
        if command.startswith("rdma") or command.startswith("nvidia-smi"):
            self.done.set()
        return result


def _rendezvous_hosts(names):
    import threading

    barrier, done = threading.Barrier(len(names)), {n: threading.Event() for n in names}
    return {n: _Rendezvous(barrier, done[n], done[names[k + 1]] if k + 1 < len(names) else None)
            for k, n in enumerate(names)}


def test_quick_check_asks_every_host_at_once_and_reports_in_inventory_order(correct):
    """Every host inside its probe at the same time; the last host finishes first, yet the problems keep the
    inventory's order with each host's own messages (the capture's interfaces are not the inventory's)."""
    bench = load_inventory(correct.inventory_path)
    hosts = _rendezvous_hosts(list(bench.hosts))
    problems = preflight.quick_check(bench, switch_of=lambda name: type("Ok", (), {"patches": dict})(),
                                     transport_of=hosts.__getitem__)
    expected = []
    for name in bench.hosts:
        for port in bench.ports_of(name):
            expected += [f"{name}/{port.netdev}: no such interface (ip -o link: enp0s31f6, lo, tun0, wg0, wlan0, wwan0)",
                         f"{name}/{port.netdev}: no RDMA port {port.rdma_dev}/{port.rdma_port} (rdma link)"]
    assert problems == expected


def test_device_identity_asks_every_host_at_once_and_keeps_each_hosts_answer():
    from devices.errors import DeviceTimeout
    from harness.identity import device_identity

    names = ["h1", "h2", "h3", "h4"]
    hosts = _rendezvous_hosts(names)
    gone = hosts["h3"].run
    hosts["h3"].run = lambda command, **kw: (gone(command, **kw), (_ for _ in ()).throw(DeviceTimeout("h3 gone")))[1]
    agent = type("Agent", (), {"python_version": "3.12.3"})()  # what install found
    sessions = {n: type("Session", (), {"transport": hosts[n], "agent": agent})() for n in names}
    found = device_identity({}, sessions, [])
    assert list(found["hosts"]) == names  # the order asked
    assert found["hosts"]["h3"] == {"nics": None, "gpus": None, "agent_python": "3.12.3", "error": "h3 gone"}
    assert all(found["hosts"][n] == {"nics": {}, "gpus": None, "agent_python": "3.12.3"} for n in ("h1", "h2", "h4"))


def test_topo_parser_reads_the_real_capture():
    topo = parse_nvidia_smi_topo(_real_topo())
    assert len(topo.links) == 8 and topo.nic_names["NIC9"] == "mlx5_9"
    assert (topo.links["GPU2"]["NIC3"], topo.links["GPU2"]["GPU5"], topo.links["GPU0"]["GPU0"]) == ("PXB", "NV12", "X")
    assert (topo.cpu_affinity["GPU4"], topo.numa_affinity["GPU4"]) == ("112-127,240-255", "7")
    assert topo.closest_gpus("mlx5_2") == ["GPU2", "GPU3"]
    assert len(topo.closest_gpus("mlx5_8")) == 8  # a NIC on no GPU's switch: every GPU is as far (SYS)


def test_emulated_topo_prints_the_real_layout():
    text = nvidia_smi_topo([EmulatedGpu(i) for i in range(8)], ["mlx5_0", "mlx5_1"])
    real = _real_topo()
    # the same legend block, byte for byte, and the same row shapes: tabs, " X " diagonal, empty NIC affinity
    assert text[text.index("Legend:"):text.index("NIC Legend:")] == real[real.index("Legend:"):real.index("NIC Legend:")]
    assert text.endswith("NIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n\n") and real.endswith("  NIC9: mlx5_9\n\n")
    for lines in (text.splitlines(), real.splitlines()):
        header = lines[0].split("\t")
        assert header[0] == "" and header[-2:] == ["CPU Affinity", "NUMA Affinity"]
        rows = [line.split("\t") for line in lines[1:] if line[:3] in ("GPU", "NIC") and "\t" in line]
        assert all(len(r) == len(header) for r in rows)
        assert all(r[1 + i] == " X " for i, r in enumerate(rows))
        assert all(r[-2:] == ["", ""] for r in rows if r[0].startswith("NIC"))
    topo = parse_nvidia_smi_topo(text)
    assert topo.closest_gpus("mlx5_0") == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert topo.closest_gpus("mlx5_1") == ["GPU4", "GPU5", "GPU6", "GPU7"]


@pytest.fixture(scope="module")
def correct():
    with EmulatedBench("instant", seed=2) as eb:
        eb.physics.ocs_apply(dict(ORIGINAL))
        yield eb


# Two fibres swapped: the RX fibres of gpu1/ens1f0np0 (claimed on egress 17) and gpu2/ens1f0np0 (egress 19);
# the TX fibre of gpu1/ens2f0np0 (claimed on ingress 2) plugged into spare ingress 12; and the TX fibres of
# gpu3/ens1f0np0 (ingress 5) and gpu4/ens1f0np0 (ingress 7) swapped: both NICs transmit, so every loop still
# lights its own receiver and light alone cannot tell (the identity probe can).
MISCABLE = [[17, 19], [2, 12], [5, 7]]


def _link_states(eb) -> dict:
    return {m.key: (s.admin_up, s.ib_state) for h in eb.physics.hosts for m in eb.physics.nic_ports(h)
            for s in [eb.physics.nic_snapshot(h, m.netdev)]}


def _settled(eb) -> dict:
    """The link states once the physics has delivered everything due (the bench is instant)."""
    assert eb.physics.wait_idle(10.0)
    return _link_states(eb)


@pytest.fixture(scope="module")
def miscabled():
    with EmulatedBench("instant", seed=2, miscable=MISCABLE) as eb:
        eb.physics.ocs_apply(dict(ORIGINAL))
        yield eb


def test_fibre_map_passes_on_a_correct_bench_and_leaves_the_cross_connects_as_before(correct):
    bench = load_inventory(correct.inventory_path)
    assert preflight.quick_check(bench) == []
    assert correct.physics.ocs_patches() == ORIGINAL
    links = _settled(correct)
    assert sorted(v for v in links.values() if v[1] == "ACTIVE") == [(True, "ACTIVE")] * 2  # lit by ORIGINAL
    truth_before = len(correct.ground_truth())
    report = preflight.fibre_map(bench, "ocs1", light_s=1.0)
    assert report.findings == [] and report.unverified == [] and report.restored and report.links_restored
    assert report.passed
    assert sorted(report.ok) == sorted(report.identified) == sorted(p.key for p in bench.nic_ports)
    assert all(lit == [f"{p.host}:{p.netdev}"] for (i, e, lit), p in zip(report.tests, bench.nic_ports))
    assert correct.physics.ocs_patches() == ORIGINAL and _settled(correct) == links
    # every NIC was set down and up once, each its own laser (ground truth: the ingress its fibre is on)
    during = correct.ground_truth()[truth_before:]
    toggled = [(t["stage"], t["host"], t["port"], t["ocs_port"]) for t in during if t["stage"] in ("admin_down", "admin_up")]
    assert toggled == [(stage, p.host, p.netdev, p.ocs_tx) for p in bench.nic_ports for stage in ("admin_down", "admin_up")]
    moved = {t["ocs_port"] for t in during if t["stage"].startswith("mirror_")}
    assert moved and moved <= set(bench.ocs["ocs1"].allowed_ports)  # only allowed ports were touched


def test_fibre_map_names_both_miscabled_fibres(miscabled, capsys):
    inventory = yaml.safe_load(miscabled.inventory_path.read_text())
    claimed = {n["netdev"]: (n["tx"], n["rx"]) for n in inventory["hosts"]["gpu1"]["nics"]}
    real = {m.netdev: (m.ocs_tx, m.ocs_rx) for m in miscabled.physics.nic_ports("gpu1")}
    assert claimed == {"ens1f0np0": (1, 17), "ens2f0np0": (2, 18)}  # the inventory claims the intended cabling
    assert real == {"ens1f0np0": (1, 19), "ens2f0np0": (12, 18)}  # the ground truth
    assert [m.ocs_tx for h in ("gpu3", "gpu4") for m in miscabled.physics.nic_ports(h)] == [7, 6, 5, 8]
    links = _settled(miscabled)
    assert main(["bench", "check", str(miscabled.inventory_path), "--light-timeout", "0.2"]) == 1
    out = capsys.readouterr().out.splitlines()
    fails = [line for line in out if line.startswith("FAIL")]
    assert fails == [
        "FAIL ocs1: inventory says gpu1/ens1f0np0 rx←OCS 17, light seen on OCS 19 (OCS 17 lights gpu2/ens1f0np0)",
        "FAIL ocs1: inventory says gpu1/ens2f0np0 tx→OCS 2, light seen on OCS 12",
        "FAIL ocs1: inventory says gpu2/ens1f0np0 rx←OCS 19, light seen on OCS 17 (OCS 19 lights gpu1/ens1f0np0)",
        "FAIL ocs1: inventory says gpu3/ens1f0np0 tx→OCS 5, light seen on OCS 7 (dark while it was set down; "
        "OCS 7 is claimed by gpu4/ens1f0np0)",
        "FAIL ocs1: inventory says gpu4/ens1f0np0 tx→OCS 7, light seen on OCS 5 (dark while it was set down; "
        "OCS 5 is claimed by gpu3/ens1f0np0)",
    ]
    assert not [line for line in out if line.startswith("WARN")]
    assert "ok   ocs1: original cross-connects restored and read back" in out
    assert "ok   ocs1: NIC admin and RDMA port states as before, read back" in out
    assert miscabled.physics.ocs_patches() == ORIGINAL and _settled(miscabled) == links


def test_discover_writes_a_draft_that_validate_accepts(correct, tmp_path, capsys):
    inventory = yaml.safe_load(correct.inventory_path.read_text())
    known = tmp_path / "known_hosts"
    known.write_text("".join(Path(h["known_hosts"]).read_text() for h in inventory["hosts"].values()))
    hosts = ",".join(f"{h['user']}@{h['address']}:{h['port']}" for h in inventory["hosts"].values())
    ocs = inventory["ocs"]["ocs1"]
    draft = tmp_path / "draft.yaml"
    identity = next(iter(inventory["hosts"].values()))["identity_file"]
    keys = {name: s.client_public_key for name, s in correct.host_servers.items()}
    for server in correct.host_servers.values():  # one lab key on every host, as on a real bench
        server.client_public_key = paramiko.Ed25519Key.from_private_key_file(identity)
    try:
        assert main(["bench", "discover", "--hosts", hosts, "--identity-file", identity, "--known-hosts", str(known),
                     "--ocs", ocs["url"], "--ocs-size", "16,16", "--out", str(draft)]) == 0  # strict host keys
    finally:
        for name, key in keys.items():
            correct.host_servers[name].client_public_key = key
    assert main(["validate", str(draft)]) == 0
    text = draft.read_text()
    found = yaml.safe_load("\n".join(line[4:] for line in text.splitlines() if line.startswith("#   ")))
    gpu1 = found["gpu1"]
    assert [(n["netdev"], n["rdma_dev"], n["rdma_port"]) for n in gpu1["nics"]] == \
        [(m.netdev, m.rdma_dev, m.rdma_port) for m in correct.physics.nic_ports("gpu1")]
    assert gpu1["nics"][0]["transceiver"]["part"].startswith("EMU-") and len(gpu1["gpus"]) == 8
    assert [n["closest_gpus"] for n in gpu1["nics"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    drafted = load_inventory(draft)
    assert sorted(drafted.hosts) == sorted(inventory["hosts"]) and len(drafted.nic_ports) == 8


def test_run_stops_at_the_preflight_before_touching_the_switch(correct, tmp_path, capsys):
    inventory = yaml.safe_load(correct.inventory_path.read_text())
    inventory["hosts"]["gpu3"]["nics"][1]["netdev"] = "ens9f0np0"
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(inventory))
    truth_before = len(correct.ground_truth())
    code = main(["run", "playbooks/turnaround.yaml", "--bench", str(path), "--cycles", "1",
                 "--out", str(tmp_path / "run"), "-q"])
    assert code == 1
    assert "run stopped: preflight: gpu3/ens9f0np0: no such interface" in capsys.readouterr().err
    assert len(correct.ground_truth()) == truth_before and correct.physics.ocs_patches() == ORIGINAL


def test_a_port_set_down_prints_as_iproute2_prints_one():
    """`ip link` of a port set down (the identity probe's read-back) has the flags of a real admin-down link."""
    from devices.emulated.nic import NicModel
    from devices.emulated.formats import ip_link_lines
    from devices.parsers.nic import parse_ip_monitor_line

    real = (Path(__file__).parent / "data" / "real" / "ip-monitor" /
            "tap-up-mac-change-deleted-jithendiran-lab.txt").read_text().splitlines()[7]
    model = NicModel("gpu1", "ens1f0np0", "mlx5_0", 1, "0c:42:a1:00:00:01", 3, 1, 17)
    ours = ip_link_lines(model, False, "down", oneline=False, monitor=True, admin_up=False).splitlines()[0]
    seen = [parse_ip_monitor_line(line) for line in (real, ours)]
    assert seen[0].flags == seen[1].flags == {"BROADCAST", "MULTICAST"} and not seen[1].admin_up
    assert (seen[0].operstate, seen[0].carrier) == (seen[1].operstate, seen[1].carrier) == ("DOWN", False)


def test_a_run_logs_into_each_host_once_preflight_and_gpu_view_included(correct, tmp_path):
    """The quick preflight and the GPU view use the run's SSH connection per host (the emulated hosts count
    the connections they accept: ground truth, not the harness's own account)."""
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "t", "seed": 3, "cycles": 1, "steps": [
        {"type": "turnaround", "name": "measure", "cycle_timeout_s": 20, "clock_warmup_s": 0.1, "probes": False,
         "settle_s": 0.05}]}))
    before = {h: s.connections for h, s in correct.host_servers.items()}
    assert main(["run", str(pb), "--bench", str(correct.inventory_path), "--out", str(tmp_path / "run"), "-q"]) == 0
    manifest = yaml.safe_load((tmp_path / "run" / "manifest.json").read_text())
    assert set(manifest["extra"]["gpu_view"]["measure"]["hosts"]) == set(correct.host_servers)  # it sampled
    assert {h: s.connections - before[h] for h, s in correct.host_servers.items()} == \
        {h: 1 for h in correct.host_servers}
    assert correct.physics.ocs_patches() == ORIGINAL


def test_a_host_that_refuses_the_link_command_leaves_tx_identity_unverified_not_passed(correct, capsys):
    bench = load_inventory(correct.inventory_path)
    links = _settled(correct)
    report = preflight.fibre_map(bench, "ocs1", light_s=0.5, link_command="no-such-tool {netdev} {state}")
    assert report.findings == [] and report.identified == [] and report.restored and report.links_restored
    assert len(report.unverified) == len(bench.nic_ports)
    assert report.unverified[0].startswith("gpu1/ens1f0np0: cannot set it down and up: ") and "exited 127" in report.unverified[0]
    assert correct.physics.ocs_patches() == ORIGINAL and _settled(correct) == links
    assert main(["bench", "check", str(correct.inventory_path), "--link-command", "ip link set {dev} {state}"]) == 2
    assert "--link-command: link command 'ip link set {dev} {state}': needs exactly the placeholders {netdev} " \
           "and {state}, has {dev}, {state}" in capsys.readouterr().err


def test_without_ingress_power_nic_receivers_watch_the_light_and_name_the_swap(miscabled, monkeypatch):
    """A switch without power monitors (its RTRV-PORT-POWER is denied): the claimed ingresses are connected onto
    receivers that passed their loop, in batches, while each NIC is set down — the same two TX fibres named."""
    from devices.emulated.switching import OcsRefusal

    def no_monitor(port):
        raise OcsRefusal("not_equipped", "No optical power monitor on this unit")

    monkeypatch.setattr(miscabled.physics, "ocs_port_power", no_monitor)
    links = _settled(miscabled)
    report = preflight.fibre_map(load_inventory(miscabled.inventory_path), "ocs1", light_s=0.2)
    assert report.identity_by.startswith("NIC receivers (the switch reports no ingress power: ")
    identity = [f for f in report.findings if "dark while it was set down" in f]
    assert identity == [
        "inventory says gpu3/ens1f0np0 tx→OCS 5, light seen on OCS 7 (dark while it was set down; "
        "OCS 7 is claimed by gpu4/ens1f0np0)",
        "inventory says gpu4/ens1f0np0 tx→OCS 7, light seen on OCS 5 (dark while it was set down; "
        "OCS 5 is claimed by gpu3/ens1f0np0)"]
    assert sorted(report.identified) == ["gpu1:ens1f0np0", "gpu2:ens1f0np0", "gpu2:ens2f0np0", "gpu3:ens2f0np0",
                                         "gpu4:ens2f0np0"]  # all but the swapped pair and the TX named by light
    assert report.unverified == [] and report.restored and report.links_restored
    assert miscabled.physics.ocs_patches() == ORIGINAL and _settled(miscabled) == links
