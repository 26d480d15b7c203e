"""The whole emulated bench: physics, OCS protocol servers and one SSH server per host, on 127.0.0.1.

It writes an ordinary inventory, so the harness drives it exactly as it drives a real bench.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from devices.emulated.physics import OpticalBench
from devices.emulated.profile import Profile, load_profile
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


class EmulatedBench:
    """Start with `with EmulatedBench("mixnet-testbed", seed=1) as bench: bench.inventory_path ...`."""

    def __init__(self, profile: Profile | str, seed: int = 0, protocol: str = DEFAULT_PROTOCOL,
                 workdir: str | os.PathLike | None = None, netns_prefix: str | None = None,
                 miscable: list | tuple = (), workers: int = 0):
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.seed = seed
        self.protocol = get_protocol(protocol).name  # unknown names fail here, before anything starts
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
        self.ocs_servers = None
        self.ocs_view = None  # the chosen protocol's view: url, description, stop()
        self.host_servers: dict = {}
        self.inventory_path = self.workdir / "inventory.yaml"

    def start(self) -> "EmulatedBench":
        from devices.emulated.ocs_server import OcsServers
        from devices.emulated.ssh_host import EmulatedHostServer

        try:
            self.physics.start()
            extra = {}
            if self.netns_prefix:
                from devices.emulated.netns import NetnsPlane, passthrough_commands

                self.netns = NetnsPlane(self.physics, self.netns_prefix)
                self.netns.start()
                extra = {h: passthrough_commands(self.netns, h) for h in self.physics.hosts}
            # the password is the one in the variable the inventory names (set to the default if unset)
            password = os.environ.get(PASSWORD_ENV) or EMULATED_PASSWORD
            os.environ[PASSWORD_ENV] = password
            self.ocs_servers = OcsServers(self.physics, user=EMULATED_USER, password=password)
            self.ocs_servers.start()
            self.ocs_view = get_protocol(self.protocol).start_emulator(self.ocs_servers)
            if self.workers:
                from devices.emulated.shards import HostWorkers

                self._shards = HostWorkers(self.physics, self.workers)
                self.host_servers = self._shards.start()
                self.physics.on_clock_step.append(self._shards.clock_stepped)
            for host in self.physics.hosts if not self.workers else ():
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
        n, m = self.physics.ocs_size
        nics = self.physics.all_nic_ports()
        claimed = self.physics.cabled_as  # the intended cabling; the lab owns the ports the fibres really use too
        allowed = sorted({p for pair in claimed.values() for p in pair} | {p.ocs_tx for p in nics}
                         | {p.ocs_rx for p in nics})
        hosts = {}
        for name, server in self.host_servers.items():
            res = server.resource()
            hosts[name] = {
                "address": res.address, "port": res.port, "user": res.user,
                "identity_file": str(server.client_key_path), "known_hosts": str(server.known_hosts_path),
                "nics": [{"netdev": p.netdev, "rdma_dev": p.rdma_dev, "rdma_port": p.rdma_port, "ocs": "ocs1",
                          "tx": claimed[p.key][0], "rx": claimed[p.key][1]} for p in self.physics.nic_ports(name)],
            }
        return {
            "bench": {"name": f"emulated-{self.profile.name}", "emulated": True},
            "ocs": {"ocs1": {"protocol": self.protocol, "url": self.ocs_view.url, "size": [n, m],
                             "allowed_ports": [str(p) for p in allowed], "user": EMULATED_USER,
                             "password_env": PASSWORD_ENV}},
            "hosts": hosts,
        }

    def ground_truth(self) -> list[dict]:
        return self.physics.ground_truth()

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
        if self.ocs_view is not None:
            try:
                self.ocs_view.stop()
            except Exception:
                pass
            self.ocs_view = None
        if self.ocs_servers is not None:
            try:
                self.ocs_servers.stop()
            except Exception:
                pass
            self.ocs_servers = None
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
