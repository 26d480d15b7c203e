"""The whole emulated bench: physics, OCS protocol servers and one SSH server per host, on 127.0.0.1.

It writes an ordinary inventory, so the harness drives it exactly as it drives a real bench. Given several
protocols (`EmulatedBench(..., protocol="polatis-tl1,polatis-scpi")`) it serves as many switches over the one
physics, each owning a share of its ports (`SwitchSlice`) and numbering them as a switch of its own.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import yaml

from devices.emulated.physics import OpticalBench
from devices.emulated.profile import Profile, load_profile
from devices.emulated.switching import OcsRefusal
from devices.ocs.registry import DEFAULT_PROTOCOL, get_protocol

PASSWORD_ENV = "OCS_HIL_EMULATED_PASSWORD"
EMULATED_USER, EMULATED_PASSWORD = "admin", "root"


@dataclass(frozen=True)
class OcsView:
    """A protocol view of the emulated switch that is already served (OcsServers runs TL1 and SCPI)."""

    url: str
    description: str
    stop: Callable[[], None] = lambda: None


def tl1_view(servers) -> OcsView:
    """Registry hook (`polatis-tl1`)."""
    host, port = servers.tl1_address
    return OcsView(f"tcp://{host}:{port}", f"TL1  tcp://{host}:{port}")


def scpi_view(servers) -> OcsView:
    """Registry hook (`polatis-scpi`)."""
    host, port = servers.scpi_address
    return OcsView(f"tcp://{host}:{port}", f"SCPI tcp://{host}:{port}   SCPI serial {servers.pty_path}")


class SwitchSlice:
    """Switch `index` of `count` over one physics: the physics' ingress p and egress q (0-based on their side)
    belong to switch `p % count` and `q % count` (NIC i, host-major, is cabled to ingress i and egress i: a
    NIC's two fibres land on one switch, its rail when NICs per host is a multiple of `count`). The switch
    numbers its own ports as a Polatis does: ingress 1..n, egress n+1..n+m. What the protocol servers read of
    a switch (`ocs_size`, `ocs_patches`, `ocs_apply`, `ocs_port_power`), over its ports only."""

    def __init__(self, physics: OpticalBench, index: int, count: int):
        self.physics, self.index, self.count = physics, index, count
        n, m = physics.ocs_size
        self._n_phys = n
        self.ocs_size = (len(range(index, n, count)), len(range(index, m, count)))

    def to_physics(self, port: int) -> int:
        n, m = self.ocs_size
        if not 1 <= port <= n + m:
            raise OcsRefusal("invalid_port", f"Invalid port {port}")
        if port <= n:
            return (port - 1) * self.count + self.index + 1
        return self._n_phys + (port - n - 1) * self.count + self.index + 1

    def owns(self, physical: int) -> bool:
        side = physical - 1 if physical <= self._n_phys else physical - self._n_phys - 1
        return side % self.count == self.index

    def from_physics(self, physical: int) -> int:
        if physical <= self._n_phys:
            return (physical - 1) // self.count + 1
        return self.ocs_size[0] + (physical - self._n_phys - 1) // self.count + 1

    def ocs_patches(self) -> dict[int, int]:
        return {self.from_physics(i): self.from_physics(e) for i, e in self.physics.ocs_patches().items()
                if self.owns(i)}

    def ocs_apply(self, adds: dict[int, int], removes: Iterable[int] = (), at_ns: int | None = None) -> int:
        n, _ = self.ocs_size
        for ingress in list(adds) + list(removes):
            if not 1 <= ingress <= n:
                raise OcsRefusal("invalid_port", f"Invalid ingress port {ingress}")
        for egress in adds.values():
            if not n < egress <= sum(self.ocs_size):
                raise OcsRefusal("invalid_port", f"Invalid egress port {egress}")
        return self.physics.ocs_apply({self.to_physics(i): self.to_physics(e) for i, e in adds.items()},
                                      [self.to_physics(i) for i in removes], at_ns=at_ns, switch=self.index)

    def ocs_port_power(self, port: int) -> float:
        return self.physics.ocs_port_power(self.to_physics(port))


class EmulatedBench:
    """Start with `with EmulatedBench("mixnet-testbed", seed=1) as bench: bench.inventory_path ...`."""

    def __init__(self, profile: Profile | str, seed: int = 0, protocol: str | Iterable[str] = DEFAULT_PROTOCOL,
                 workdir: str | os.PathLike | None = None, netns_prefix: str | None = None,
                 miscable: list | tuple = (), workers: int = 0, sshd: bool = False):
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.seed = seed
        # one switch per protocol ("a,b" or a list); unknown names fail here, before anything starts
        names = protocol.split(",") if isinstance(protocol, str) else list(protocol)
        self.protocols = tuple(get_protocol(name.strip()).name for name in names)
        self.protocol = self.protocols[0]
        # miscable [[a, b], ...]: fibres at OCS ports a and b swapped; the inventory still claims the intended map
        self.physics = OpticalBench(self.profile, seed=seed, miscable=miscable)
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="ocs-hil-bench-")
        self.workdir = Path(workdir or self._tmp.name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.netns_prefix = netns_prefix
        # workers > 0: the hosts' SSH servers run in that many processes over this one physics (a pod on few
        # cores, devices/emulated/shards.py); 0: in this process
        if workers and netns_prefix:
            raise ValueError("host workers cannot serve a netns data plane (its commands run in this process)")
        self.workers = int(workers)
        self._shards = None
        self.netns = None
        # sshd: each host a real OpenSSH sshd in its namespace of the data plane (devices/emulated/sshd_hosts.py)
        if sshd and not netns_prefix:
            raise ValueError("sshd hosts live in the netns data plane: give a netns_prefix")
        self.sshd = sshd
        self.sshd_hosts = None
        self.ocs_servers = None  # the first switch's servers (fault injection drives this one)
        self.ocs_view = None  # the first switch's view in its protocol: url, description, stop()
        self.switches: dict[str, tuple] = {}  # inventory name -> (servers, view, SwitchSlice | None)
        self.host_servers: dict = {}
        self.inventory_path = self.workdir / "inventory.yaml"

    def start(self) -> "EmulatedBench":
        from devices.emulated.ocs_server import OcsServers
        from devices.emulated.host.server import EmulatedHostServer

        try:
            self.physics.start()
            extra = {}
            if self.netns_prefix:
                from devices.emulated.netns import NetnsPlane, passthrough_commands

                self.netns = NetnsPlane(self.physics, self.netns_prefix)
                self.physics.realise_when_run()
                if self.sshd:
                    from devices.emulated.sshd_hosts import SshdHosts

                    # first: a port's RDMA state file is written before the plane wires frames to it
                    self.sshd_hosts = SshdHosts(self.netns, self.workdir / "sshd").start()
                self.netns.start()
                if not self.sshd:
                    extra = {h: passthrough_commands(self.netns, h) for h in self.physics.hosts}
            # the password is the one in the variable the inventory names (set to the default if unset)
            password = os.environ.get(PASSWORD_ENV) or EMULATED_PASSWORD
            os.environ[PASSWORD_ENV] = password
            count = len(self.protocols)
            for index, protocol in enumerate(self.protocols):
                part = SwitchSlice(self.physics, index, count) if count > 1 else None
                servers = OcsServers(part or self.physics, user=EMULATED_USER, password=password)
                self.switches[f"ocs{index + 1}"] = (servers.start(), None, part)  # stopped even if its view fails
                self.switches[f"ocs{index + 1}"] = (servers, get_protocol(protocol).start_emulator(servers), part)
            self.ocs_servers, self.ocs_view, _ = self.switches["ocs1"]
            if self.workers:
                from devices.emulated.shards import HostWorkers

                self._shards = HostWorkers(self.physics, self.workers)
                self.host_servers = self._shards.start()
                self.physics.on_clock_step.append(self._shards.clock_stepped)
            for host in self.physics.hosts if not (self.workers or self.sshd) else ():
                server = EmulatedHostServer(self.physics, host, extra_commands=extra.get(host))
                server.start()
                self.host_servers[host] = server
            self.inventory_path.write_text(yaml.safe_dump(self.inventory(), sort_keys=False))
        except BaseException:
            self.stop()
            raise
        return self

    def inventory(self) -> dict:
        """The bench as an inventory (ARCHITECTURE.md contract)."""
        nics = self.physics.all_nic_ports()
        claimed = self.physics.cabled_as  # the intended cabling; the lab owns the ports the fibres really use too
        used = {p for pair in claimed.values() for p in pair} | {p.ocs_tx for p in nics} | {p.ocs_rx for p in nics}

        def on_switch(physical: int) -> tuple[str, int]:  # (the switch, its own port number)
            for name, (_, _, part) in self.switches.items():
                if part is None or part.owns(physical):
                    return name, part.from_physics(physical) if part is not None else physical
            raise AssertionError(physical)

        hosts = {}
        resources = ({h: self.sshd_hosts.resource(h) for h in self.physics.hosts} if self.sshd_hosts is not None
                     else {name: server.resource() for name, server in self.host_servers.items()})
        for name, res in resources.items():
            nic_rows = []
            for p in self.physics.nic_ports(name):
                (ocs, tx), (_, rx) = on_switch(claimed[p.key][0]), on_switch(claimed[p.key][1])
                nic_rows.append({"netdev": p.netdev, "rdma_dev": p.rdma_dev, "rdma_port": p.rdma_port, "ocs": ocs,
                                 "tx": tx, "rx": rx,
                                 "gbps": self.physics.nic_snapshot(p.host, p.netdev).speed_mbps / 1000})
            hosts[name] = {
                "address": res.address, "port": res.port, "user": res.user,
                "identity_file": res.identity_file, "known_hosts": res.known_hosts,
                "nics": nic_rows,
            }
        switches = {}
        for (name, (servers, view, _)), protocol in zip(self.switches.items(), self.protocols):
            allowed = sorted(port for ocs, port in map(on_switch, used) if ocs == name)
            switches[name] = {"protocol": protocol, "url": view.url, "size": list(servers.bench.ocs_size),
                              "allowed_ports": [str(p) for p in allowed], "user": EMULATED_USER,
                              "password_env": PASSWORD_ENV}
        bench = {"name": f"emulated-{self.profile.name}", "emulated": True}
        if self.workers:  # the leaf–spine's state (devices/emulated/leafspine.py) is per process: a study refuses
            bench["host_workers"] = self.workers
        if self.sshd_hosts is not None:  # real sshd: its host keys are known, and checked as on a real bench
            bench["strict_host_keys"] = True
        return {"bench": bench, "ocs": switches, "hosts": hosts}

    def ground_truth(self) -> list[dict]:
        """The physics' events at their due times; with sshd hosts, a stage a host reads from the kernel or a file
        (devices.emulated.sshd_hosts.REALISED_STAGES) at the middle of the window in which that changed."""
        t, code, keys, _ = self.ground_truth_columns()
        return [{"t_ns": int(ti), **dict(zip(("stage", "host", "port", "ocs_port"), keys[c]))} for ti, c in zip(t, code)]

    def ground_truth_columns(self, stages=None, start: int = 0, stop: int | None = None):
        """`ground_truth()` as columns (devices.emulated.truth.TruthLog.columns), only `stages` if given, of the
        rows [start, stop) if given (`physics.truth_rows()`), and each row's half-width (None where every row is
        exact): a realised stage is known only to within its window, which a loaded machine widens."""
        t, code, keys = self.physics.ground_truth_columns(stages, start, stop)
        if self.sshd_hosts is None:
            return t, code, keys, None
        import numpy as np

        from devices.emulated.sshd_hosts import REALISED_STAGES

        realised = self.sshd_hosts.realised()
        halfwidth = np.zeros(len(t), dtype=np.int64)
        for k, (stage, host, port, _) in enumerate(keys):
            marks = REALISED_STAGES.get(stage)
            if not marks:
                continue
            for i in (code == k).nonzero()[0]:
                window = realised.get((host, port, *marks, int(t[i])))
                if window:
                    t[i] = (window[0] + window[1]) // 2
                    halfwidth[i] = (window[1] - window[0] + 1) // 2
        return t, code, keys, halfwidth

    def ground_truth_frame(self, stages=None):
        """`ground_truth()` as a DataFrame (devices.emulated.truth.TRUTH_COLUMNS), only `stages` if given."""
        from devices.emulated.truth import truth_frame

        return truth_frame(*self.ground_truth_columns(stages))

    def stop(self) -> None:
        for server in self.host_servers.values():
            try:
                server.stop()
            except Exception:  # teardown must reach every server
                pass
        self.host_servers = {}
        if self._shards is not None:
            self._shards.stop()
            self._shards = None
        for servers, view, _ in self.switches.values():
            for stop in (view.stop if view is not None else None, servers.stop):
                try:
                    if stop is not None:
                        stop()
                except Exception:  # teardown must reach every switch
                    pass
        self.switches = {}
        self.ocs_servers = self.ocs_view = None
        if self.sshd_hosts is not None:
            self.sshd_hosts.stop()
            self.sshd_hosts = None
        if self.netns is not None:
            self.netns.stop()
            self.netns = None
        self.physics.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "EmulatedBench":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
