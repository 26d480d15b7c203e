"""Bench discovery and preflight: what is really on the bench, and whether the inventory says the same.

- `quick_check(bench)`: every host answers over SSH, every NIC port and RDMA port the inventory names exists,
  every OCS answers and reads back a state (`harness run` calls it before it touches a switch);
- `fibre_map(bench, ocs)`: the fibres checked through the switch. With every other circuit on the allowed
  ports dropped, it connects one candidate pair at a time — a NIC's claimed TX ingress to its claimed RX
  egress first (a fibre loop back into itself) — and reads every NIC's Rx loss of signal (`ethtool -m`) to
  see which receiver lights. A NIC whose loop does not light it alone is then localised against a NIC that
  passed: its TX (`claimed ingress -> a good receiver`, else the unclaimed allowed ingresses one by one)
  and its RX (`a good transmitter -> claimed egress`, else the unclaimed allowed egresses). The original
  cross-connects are restored and read back afterwards (CircuitGuard), every step bounded;
- `discover(...)`: a draft inventory from what the hosts report (NICs, RDMA ports, transceivers, GPUs and
  their closest NICs from `nvidia-smi topo -m`).
Light is light: two TX fibres swapped between NICs that both transmit light both receivers alike, so the
check proves where light enters, not whose; that needs a data-plane probe (named in the report).
"""
from __future__ import annotations

import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from devices.errors import DeviceError
from devices.parsers.common import ParseError
from devices.parsers.gpu import parse_nvidia_smi_csv, parse_nvidia_smi_topo
from devices.parsers.nic import (IpLink, RdmaLink, parse_ethtool_module, parse_ip_link_json, parse_ip_link_oneline,
                                 parse_rdma_link, parse_rdma_link_json)
from devices.resources import Bench, HostResource, NicPort
from devices.ssh import SshTransport
from devices.timing import Deadline

LIT_DBM = -30.0  # receive power above which a module without an Rx LOS flag (ethtool < 6.4) sees light


class PreflightFailed(DeviceError):
    """The bench does not match its inventory (a host, NIC, RDMA port or switch named there is missing)."""


def _transport(host: HostResource, timeout_s: float) -> SshTransport:
    return SshTransport(host, connect_timeout=timeout_s, retries=1, backoff_s=0.1)


def _json_else_text(transport: SshTransport, timeout_s: float, json_command: str, parse_json,
                    text_command: str, parse_text) -> list:
    """iproute2's JSON where the host's release has `-j` (values without a layout to guess, held to real
    captures in tests/data/real/); the text form where it has not (an error exit, or no JSON array)."""
    result = transport.run(json_command, deadline=Deadline(timeout_s), check=False)
    if result.exit_status == 0:
        try:
            return parse_json(result.stdout)
        except ParseError:
            pass
    return parse_text(transport.run(text_command, deadline=Deadline(timeout_s), check=True).stdout)


def _links(transport: SshTransport, timeout_s: float) -> list[IpLink]:
    return _json_else_text(transport, timeout_s, "ip -j link", parse_ip_link_json, "ip -o link", parse_ip_link_oneline)


def _rdma_links(transport: SshTransport, timeout_s: float) -> list[RdmaLink]:
    return _json_else_text(transport, timeout_s, "rdma -j link", parse_rdma_link_json, "rdma link", parse_rdma_link)


def quick_check(bench: Bench, *, timeout_s: float = 10.0) -> list[str]:
    """Problems found (empty when every switch, host, NIC port and RDMA port named is there), switches first."""
    from devices.ocs import open_switch

    problems: list[str] = []
    for name, resource in bench.ocs.items():
        try:
            switch = open_switch(resource, timeout_s=timeout_s)
            try:
                switch.patches()
            finally:
                switch.close()
        except (DeviceError, OSError) as exc:
            problems.append(f"ocs {name}: {exc}")
    for name, host in bench.hosts.items():
        transport = _transport(host, timeout_s)
        try:
            netdevs = {link.ifname for link in _links(transport, timeout_s)}
            rdma = {(r.dev, r.port): r.netdev for r in _rdma_links(transport, timeout_s)}
        except (DeviceError, ParseError) as exc:
            problems.append(f"host {name}: {exc}")
            continue
        finally:
            transport.close()
        for port in bench.ports_of(name):
            if port.netdev not in netdevs:
                problems.append(f"{name}/{port.netdev}: no such interface (ip -o link: {', '.join(sorted(netdevs))})")
            if (port.rdma_dev, port.rdma_port) not in rdma:
                problems.append(f"{name}/{port.netdev}: no RDMA port {port.rdma_dev}/{port.rdma_port} (rdma link)")
            elif rdma[(port.rdma_dev, port.rdma_port)] not in (None, port.netdev):
                problems.append(f"{name}/{port.netdev}: RDMA port {port.rdma_dev}/{port.rdma_port} is on "
                                f"{rdma[(port.rdma_dev, port.rdma_port)]}, not {port.netdev}")
    return problems


# ====================================================================== fibre map


class _Receivers:
    """Which NIC receivers see light now, from `ethtool -m` on every host (one SSH connection each)."""

    def __init__(self, bench: Bench, ports: list[NicPort], timeout_s: float):
        self.ports, self.timeout_s = ports, timeout_s
        self.transports = {h: _transport(bench.hosts[h], timeout_s) for h in sorted({p.host for p in ports})}
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.transports)), thread_name_prefix="preflight")

    def _lit_on(self, host: str) -> set[str]:
        seen = set()
        for port in (p for p in self.ports if p.host == host):
            out = self.transports[host].run(f"ethtool -m {shlex.quote(port.netdev)}",
                                            deadline=Deadline(self.timeout_s), check=True).stdout
            module = parse_ethtool_module(out)
            light = (not module.rx_los) if module.rx_los is not None else max(module.rx_power_dbm or (-99,)) > LIT_DBM
            if light:
                seen.add(port.key)
        return seen

    def lit(self) -> frozenset[str]:
        """One reading of every receiver, the hosts read in parallel."""
        return frozenset().union(*self._pool.map(self._lit_on, self.transports))

    def wait(self, done, within_s: float, poll_s: float) -> frozenset[str]:
        """Poll until `done(lit)` or `within_s` passes; the last reading. (A module latches LOS until read:
        the first read after a dark spell may still say LOS, so a change is read again, never assumed.)"""
        deadline = Deadline(within_s)
        while True:
            lit = self.lit()
            if done(lit) or deadline.expired():
                return lit
            time.sleep(poll_s)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for t in self.transports.values():
            t.close()


@dataclass
class FibreReport:
    ocs: str
    ok: list[str] = field(default_factory=list)  # NIC keys whose loop lit them alone
    findings: list[str] = field(default_factory=list)  # one line per fibre that is not where the inventory says
    tests: list[tuple[int, int, list[str]]] = field(default_factory=list)  # (ingress, egress, lit NIC keys)
    restored: bool = False
    restore_error: str | None = None

    @property
    def passed(self) -> bool:
        return not self.findings and self.restored


def _name(port: NicPort) -> str:
    return f"{port.host}/{port.netdev}"


def fibre_map(bench: Bench, ocs: str, *, light_s: float = 2.0, poll_s: float = 0.01,
              timeout_s: float = 10.0) -> FibreReport:
    """Check every fibre of the NIC ports on `ocs` (see the module doc). Touches allowed ports only (the
    driver refuses others before sending); the caller holds the bench lease."""
    from devices.ocs import open_switch
    from harness.bench.circuits import CircuitGuard, RetryPolicy

    resource = bench.ocs[ocs]
    ports = [p for p in bench.nic_ports if p.ocs == ocs]
    n_in = resource.size[0]
    report = FibreReport(ocs)
    switch = open_switch(resource, timeout_s=timeout_s)
    receivers = None
    guard = CircuitGuard(ocs, switch, snapshot_path=None, resuming=False)
    policy = RetryPolicy(timeout_s=timeout_s)
    cache: dict[tuple[int, int], frozenset[str]] = {}
    try:
        receivers = _Receivers(bench, ports, timeout_s)
        guard.apply({}, policy, exclusive=True)
        receivers.wait(lambda lit: not lit, light_s, poll_s)

        def test(ingress: int, egress: int) -> frozenset[str]:
            if (ingress, egress) not in cache:
                guard.apply({ingress: egress}, policy, exclusive=True)
                lit = receivers.wait(bool, light_s, poll_s)
                guard.apply({}, policy, exclusive=True)
                receivers.wait(lambda now: not now, light_s, poll_s)
                cache[(ingress, egress)] = lit
                report.tests.append((ingress, egress, sorted(lit)))
            return cache[(ingress, egress)]

        failing = []
        for port in ports:
            (report.ok.append(port.key) if test(port.ocs_tx, port.ocs_rx) == {port.key} else failing.append(port))
        good = [p for p in ports if p.key in report.ok]
        if failing and not good:
            report.findings += [f"{_name(p)}: its loop OCS {p.ocs_tx}->{p.ocs_rx} lit "
                                f"{', '.join(k.replace(':', '/', 1) for k in sorted(cache[(p.ocs_tx, p.ocs_rx)])) or 'nothing'}"
                                "; no NIC passed to localise against" for p in failing]
            return report
        ref = good[0]
        allowed_in = sorted(p for p in resource.allowed_ports if p <= n_in)
        allowed_out = sorted(p for p in resource.allowed_ports if p > n_in)
        claimed_in = {p.ocs_tx for p in ports}
        for port in failing:
            if ref.key not in test(port.ocs_tx, ref.ocs_rx):
                # light from a TX fibre sits on an ingress no NIC claims (a claimed one is its owner's)
                spare = [i for i in allowed_in if i not in claimed_in]
                seen = [i for i in spare if ref.key in test(i, ref.ocs_rx)]
                report.findings.append(f"inventory says {_name(port)} tx→OCS {port.ocs_tx}, "
                                       + (f"light seen on OCS {', '.join(map(str, seen))}" if seen else
                                          "no light on any allowed ingress"))
            lit = test(ref.ocs_tx, port.ocs_rx)
            if port.key not in lit:
                spare = [e for e in allowed_out if e not in {g.ocs_rx for g in good} | {port.ocs_rx}]
                found = next((e for e in spare if port.key in test(ref.ocs_tx, e)), None)
                report.findings.append(
                    f"inventory says {_name(port)} rx←OCS {port.ocs_rx}, light seen on OCS "
                    f"{found if found is not None else 'no allowed egress'}"
                    + (f" (OCS {port.ocs_rx} lights {', '.join(k.replace(':', '/', 1) for k in sorted(lit))})"
                       if lit else ""))
        return report
    finally:
        outcome = guard.restore(within_s=max(15.0, timeout_s))
        report.restored, report.restore_error = outcome.restored, outcome.error
        if receivers is not None:
            receivers.close()
        switch.close()


# ====================================================================== discovery


def discover_host(host: HostResource, *, timeout_s: float = 10.0) -> dict:
    """What one host reports: hostname, RDMA ports with their netdevs and transceivers, GPUs and the GPUs
    closest to each NIC (`nvidia-smi topo -m`; no GPUs where nvidia-smi is missing)."""
    transport = _transport(host, timeout_s)
    try:
        def run(command: str, check: bool = True) -> str:
            result = transport.run(command, deadline=Deadline(timeout_s), check=check)
            return result.stdout if result.exit_status == 0 else ""

        hostname = run("hostname").strip() or host.name
        links = {link.ifname: link for link in _links(transport, timeout_s)}
        nics = []
        for r in _rdma_links(transport, timeout_s):
            nic = {"netdev": r.netdev, "rdma_dev": r.dev, "rdma_port": r.port, "state": r.state,
                   "mac": links[r.netdev].mac if r.netdev in links else None}
            module_text = run(f"ethtool -m {shlex.quote(r.netdev)}", check=False) if r.netdev else ""
            if module_text:
                m = parse_ethtool_module(module_text)
                nic["transceiver"] = {"vendor": m.vendor_name, "part": m.vendor_pn, "serial": m.vendor_sn,
                                      "type": f"0x{m.identifier:02x}" if m.identifier is not None else None}
            nics.append(nic)
        gpus: list[dict] = []
        query = run("nvidia-smi --query-gpu=index,name,pci.bus_id,uuid --format=csv,noheader", check=False)
        if query:
            rows = parse_nvidia_smi_csv(query, ["index", "name", "pci.bus_id", "uuid"], header=False).records()
            gpus = [{"index": int(row["index"]), "name": row["name"], "pci_bus_id": row["pci.bus_id"],
                     "uuid": row["uuid"]} for row in rows]
            topo_text = run("nvidia-smi topo -m", check=False)
            if topo_text:
                topo = parse_nvidia_smi_topo(topo_text)
                for nic in nics:
                    nic["closest_gpus"] = [int(g[3:]) for g in topo.closest_gpus(nic["rdma_dev"])]
        return {"hostname": hostname, "nics": nics, "gpus": gpus}
    finally:
        transport.close()


def draft_inventory(hosts: dict[str, tuple[HostResource, dict]], ocs: dict | None) -> dict:
    """An inventory `harness validate` accepts. The fibre map is a placeholder (NIC k: ingress k, egress
    N+k) until `harness bench check` has verified it (`draft_text` writes what was found as comments)."""
    n_in = ocs["size"][0] if ocs else 0
    k = 0
    out_hosts = {}
    for name, (res, found) in hosts.items():
        entry = {"address": res.address, "port": res.port, "user": res.user}
        if res.identity_file:
            entry["identity_file"] = res.identity_file
        if res.known_hosts:
            entry["known_hosts"] = res.known_hosts
        nics = []
        for nic in found["nics"]:
            if not nic["netdev"]:
                continue
            k += 1
            row = {"netdev": nic["netdev"], "rdma_dev": nic["rdma_dev"], "rdma_port": nic["rdma_port"]}
            if ocs:
                row.update(ocs="ocs1", tx=k, rx=n_in + k)
            nics.append(row)
        entry["nics"] = nics
        out_hosts[name] = entry
    inventory: dict = {"bench": {"name": "draft", "emulated": not all(r.strict_host_key for r, _ in hosts.values())}}
    if ocs:
        ports = sorted({p for h in out_hosts.values() for n in h["nics"] for p in (n["tx"], n["rx"])})
        inventory["ocs"] = {"ocs1": {**ocs, "allowed_ports": [str(p) for p in ports]}}
    inventory["hosts"] = out_hosts
    return inventory


def draft_text(hosts: dict[str, tuple[HostResource, dict]], ocs: dict | None) -> str:
    import yaml

    found = yaml.safe_dump({name: f for name, (_, f) in hosts.items()}, sort_keys=False)
    head = ["# Draft inventory written by `harness bench discover`.",
            "# The tx/rx ports are placeholders: run `harness bench check` on this file to find the real fibre map.",
            "# What the hosts reported (NICs, transceivers, GPUs and the GPUs closest to each NIC):"]
    head += [f"#   {line}" for line in found.splitlines()]
    return "\n".join(head) + "\n" + yaml.safe_dump(draft_inventory(hosts, ocs), sort_keys=False)
