"""Bench discovery and preflight: what is really on the bench, and whether the inventory says the same.

- `quick_check(bench)`: every host answers over SSH, every NIC port and RDMA port the inventory names exists,
  every OCS answers and reads back a state (`harness run` calls it before it touches a switch); all hosts at
  once (harness.fanout), the problems in inventory order;
- `fibre_map(bench, ocs)`: the fibres checked through the switch. With every other circuit on the allowed
  ports dropped, it connects one candidate pair at a time — a NIC's claimed TX ingress to its claimed RX
  egress first (a fibre loop back into itself) — and reads every NIC's Rx loss of signal (`ethtool -m`) to
  see which receiver lights. A NIC whose loop does not light it alone is then localised against a NIC that
  passed: its TX (`claimed ingress -> a good receiver`, else the unclaimed allowed ingresses one by one)
  and its RX (`a good transmitter -> claimed egress`, else the unclaimed allowed egresses). The original
  cross-connects are restored and read back afterwards (CircuitGuard), every step bounded;
  then whose light it is (`_tx_identity`): light shows where a TX fibre enters, not whose it is, so two TX
  fibres swapped between two NICs that both transmit light both loops alike. Each NIC in turn is set down
  (`ip link set dev X down`) and the OCS's own ingress power monitors (TL1 RTRV-PORT-POWER, SCPI :MON:POW?,
  NETCONF opm-power) show which allowed ingress goes dark (without monitors: receivers that passed their
  loop, the claimed ingresses connected onto them); it is set up again and the light must return.
  Assumption, stated in the report where it fails: a port set down stops transmitting (mlx5's close sets
  the port's admin status down, PAOS; ethtool's module power-mode-policy `auto` puts a paged module in low
  power, data path off; whether the laser goes dark is up to firmware and module, so it is looked at). A NIC
  whose laser stays on darkens nothing and is reported as unverified, never as verified. At the end every
  NIC's admin state and RDMA port state are read back against what they were before the check;
- `discover(...)`: a draft inventory from what the hosts report (NICs, RDMA ports, transceivers, GPUs and
  their closest NICs from `nvidia-smi topo -m`); where `rdma` or `nvidia-smi --query-gpu` do not answer, from
  ibstat / ibv_devinfo / ibstatus with ibdev2netdev (or sysfs) and from the default `nvidia-smi` table.
"""
from __future__ import annotations

import contextlib
import math
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from devices.errors import DeviceError
from devices.parsers.common import ParseError
from devices.parsers.gpu import parse_nvidia_smi_csv, parse_nvidia_smi_table, parse_nvidia_smi_topo
from devices.parsers.ib_tools import parse_ibdev2netdev, parse_ibstat, parse_ibstatus, parse_ibv_devinfo
from devices.parsers.nic import (RDMA_PHYS_STATES, IpLink, ModuleFlags, RdmaLink, parse_ethtool_module,
                                 parse_ip_link_json, parse_ip_link_oneline, parse_rdma_link, parse_rdma_link_json)
from devices.resources import Bench, HostResource, NicPort
from devices.ssh import CommandFailed, SshTransport
from devices.timing import Deadline
from analysis.stages import PORT_CHAIN, STAGE_TABLE, STAGES_DOWN
from harness.fanout import fan_out

LIT_DBM = -30.0  # receive power above which a module without an Rx LOS flag (ethtool < 6.4, any SFP) sees light
LINK_COMMAND = "ip link set dev {netdev} {state}"  # state: up | down; under sudo -n where the host says become: sudo


def check_link_command(template: str) -> str:
    """The template with its placeholders checked ({netdev} and {state}, nothing else): ValueError otherwise."""
    import string

    names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    if names != {"netdev", "state"}:
        raise ValueError(f"link command {template!r}: needs exactly the placeholders {{netdev}} and {{state}}, "
                         f"has {', '.join(sorted('{' + n + '}' for n in names)) or 'none'}")
    return template


class PreflightFailed(DeviceError):
    """The bench does not match its inventory (a host, NIC, RDMA port or switch named there is missing)."""


def receiver_lit(module: ModuleFlags) -> bool:
    """Whether a module's receiver sees light: its Rx loss-of-signal flags where the tool prints them (ethtool
    >= 6.4, SFF-8636 / CMIS), else its strongest lane's receive power (older ethtool; SFF-8472 SFPs, whose one
    lane is `Receiver signal average optical power`)."""
    if module.rx_los is not None:
        return not module.rx_los
    return max(module.rx_power_dbm, default=-math.inf) > LIT_DBM


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


def quick_check(bench: Bench, *, timeout_s: float = 10.0, switch_of: Callable | None = None,
                transport_of: Callable | None = None) -> list[str]:
    """Problems found (empty when every switch, host, NIC port and RDMA port named is there), switches first.
    `switch_of(name)` / `transport_of(host)`: the caller's own drivers and SSH connections (a run's: its steps
    reuse them, so the check opens nothing extra), left open; without them each gets its own, closed here."""
    from devices.ocs import open_switch

    def check_switch(name: str) -> list[str]:
        try:
            switch = switch_of(name) if switch_of else open_switch(bench.ocs[name], timeout_s=timeout_s)
            try:
                switch.patches()
            finally:
                if not switch_of:
                    switch.close()
        except (DeviceError, OSError) as exc:
            return [f"ocs {name}: {exc}"]
        return []

    def check_host(name: str) -> list[str]:
        try:
            transport = transport_of(name) if transport_of else _transport(bench.hosts[name], timeout_s)
        except DeviceError as exc:
            return [f"host {name}: {exc}"]
        try:
            netdevs = {link.ifname for link in _links(transport, timeout_s)}
            rdma = {(r.dev, r.port): r.netdev for r in _rdma_links(transport, timeout_s)}
        except (DeviceError, ParseError) as exc:
            return [f"host {name}: {exc}"]
        finally:
            if not transport_of:
                transport.close()
        problems = []
        for port in bench.ports_of(name):
            if port.netdev not in netdevs:
                problems.append(f"{name}/{port.netdev}: no such interface (ip -o link: {', '.join(sorted(netdevs))})")
            if (port.rdma_dev, port.rdma_port) not in rdma:
                problems.append(f"{name}/{port.netdev}: no RDMA port {port.rdma_dev}/{port.rdma_port} (rdma link)")
            elif rdma[(port.rdma_dev, port.rdma_port)] not in (None, port.netdev):
                problems.append(f"{name}/{port.netdev}: RDMA port {port.rdma_dev}/{port.rdma_port} is on "
                                f"{rdma[(port.rdma_dev, port.rdma_port)]}, not {port.netdev}")
        return problems

    # every switch, then every host, each asked at once (a bounded pool); problems in inventory order
    found = fan_out(check_switch, bench.ocs, name="preflight") + fan_out(check_host, bench.hosts, name="preflight")
    return [problem for problems in found for problem in problems]


# ====================================================================== stages a host can observe
# The stages the agent reads from `ethtool -m` (its module flags) and which flag each needs.
ETHTOOL_STAGES = {s.name: s.watch[0] for s in STAGE_TABLE if s.watch and s.watch[0] in ("rx_los", "rx_lol")}
PORT_STAGES = tuple(dict.fromkeys(PORT_CHAIN + STAGES_DOWN))


@dataclass(frozen=True)
class HostStages:
    """What one host's agent will observe, and why not the rest. `lost`: stage -> why, `fixable` when the lab
    can mend it (a tool missing, no privilege, sudo refused) rather than its module or ethtool not reporting a
    flag; `notes`: what is not checked here but needed (CAP_NET_RAW for the probes)."""

    host: str
    how: str  # "lab@gpu1 via sudo -n"
    observed: tuple[str, ...]
    lost: dict[str, tuple[str, bool]]
    notes: tuple[str, ...] = ()

    def line(self) -> str:
        text = f"host {self.host} ({self.how}): observes {', '.join(self.observed) or 'nothing'}"
        by_why: dict[str, list[str]] = {}
        for stage, (why, _) in self.lost.items():
            by_why.setdefault(why, []).append(stage)
        text += "".join(f"; not {', '.join(stages)}: {why}" for why, stages in by_why.items())
        return text + "".join(f"; {note}" for note in self.notes)


def _tool_problem(result, host: HostResource, tool: str) -> str | None:
    """Why `ethtool -m` (as the host runs it) gave no module record: fixable causes named as the lab sees them."""
    err = (result.stderr.strip().splitlines() or [""])[-1][:160]
    if "a password is required" in result.stderr or "sudo:" in err:
        return f"sudo -n refused ({err})"
    if result.exit_status == 127 or "not found" in err or "No such file" in err:
        return (f"{host.tool(tool)} not found (set tools.{tool} to its absolute path)" if host.tool(tool) == tool
                else f"{host.tool(tool)} not found")
    if "Operation not permitted" in result.stderr or "Permission denied" in result.stderr:
        return f"no privilege for `{tool} -m` ({host.user} is not root: set become: sudo)"
    if result.exit_status != 0:
        return f"no module EEPROM ({tool} -m: {err or 'exit %d' % result.exit_status})"
    return None


def host_stages(bench: Bench, name: str, transport: SshTransport, *, probes: bool = True,
                timeout_s: float = 10.0) -> HostStages:
    """Ask the host what its agent can see: `sudo -n true` when it declares `become: sudo`, then `ethtool -m`
    on its first NIC port exactly as the agent will run it (declared path, under sudo -n)."""
    host = bench.hosts[name]
    how = f"{host.user}@{host.address}" + (" via sudo -n" if host.become == "sudo" else "")
    stages = [s for s in PORT_STAGES if probes or s != "first_packet"]
    lost: dict[str, tuple[str, bool]] = {}
    if host.become == "sudo":
        result = transport.run("sudo -n true", deadline=Deadline(timeout_s), check=False)
        if result.exit_status != 0:
            why = f"sudo -n refused ({(result.stderr.strip().splitlines() or [''])[-1][:160]}): the agent cannot run"
            return HostStages(name, how, (), {s: (why, True) for s in stages})
    ports = bench.ports_of(name)
    if ports:
        result = transport.run(f"ethtool -m {shlex.quote(ports[0].netdev)}", deadline=Deadline(timeout_s), check=False)
        problem = _tool_problem(result, host, "ethtool")
        if problem:
            lost.update({s: (problem, True) for s in ETHTOOL_STAGES})
        else:
            try:
                flags = parse_ethtool_module(result.stdout)
            except ParseError:
                flags = None
            for stage, field_ in ETHTOOL_STAGES.items():
                present = flags is not None and (flags.rx_loss_of_signal if field_ == "rx_los"
                                                 else flags.rx_loss_of_lock) is not None
                if not present:
                    lost[stage] = ("`ethtool -m` shows no Rx loss of signal (ethtool < 6.4)" if field_ == "rx_los" else
                                   "`ethtool -m` shows no Rx loss of lock (ethtool < 6.4, or a module without CDR)",
                                   False)
    notes = ()
    if probes and not bench.emulated and host.user != "root" and host.become != "sudo":
        notes = (f"first_packet needs CAP_NET_RAW for the probes ({host.user} is not root, no become: sudo)",)
    return HostStages(name, how, tuple(s for s in stages if s not in lost), lost, notes)


def stage_report(bench: Bench, transport_of: Callable, *, probes: bool = True,
                 timeout_s: float = 10.0) -> list[HostStages]:
    """`host_stages` for every host at once, in inventory order."""
    return fan_out(lambda name: host_stages(bench, name, transport_of(name), probes=probes, timeout_s=timeout_s),
                   bench.hosts, name="preflight")


# ====================================================================== fibre map


class _Nics:
    """The NICs of the check over one SSH connection per host: which receivers see light now (`ethtool -m`),
    their admin and RDMA port states, and `ip link set dev X up|down`."""

    def __init__(self, bench: Bench, ports: list[NicPort], timeout_s: float, link_command: str = LINK_COMMAND):
        self.ports, self.timeout_s, self.link_command = ports, timeout_s, link_command
        self.transports = {h: _transport(bench.hosts[h], timeout_s) for h in sorted({p.host for p in ports})}
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.transports)), thread_name_prefix="preflight")

    def _lit_on(self, host: str) -> set[str]:
        seen = set()
        for port in (p for p in self.ports if p.host == host):
            out = self.transports[host].run(f"ethtool -m {shlex.quote(port.netdev)}",
                                            deadline=Deadline(self.timeout_s), check=True).stdout
            if receiver_lit(parse_ethtool_module(out)):
                seen.add(port.key)
        return seen

    def lit(self) -> frozenset[str]:
        """One reading of every receiver, the hosts read in parallel."""
        return frozenset().union(*self._pool.map(self._lit_on, self.transports))

    def wait(self, done, within_s: float, poll_s: float) -> frozenset[str]:
        """Poll until `done(lit)` or `within_s` passes; the last reading. A module latches LOS until read:
        the first read after a dark spell may still say LOS, so it never decides alone — the deadline ends
        the wait only from the second reading on (a loaded host may take longer than `within_s` per read)."""
        deadline = Deadline(within_s)
        reads = 0
        while True:
            lit = self.lit()
            reads += 1
            if done(lit) or (deadline.expired() and reads >= 2):
                return lit
            time.sleep(poll_s)

    def _states_on(self, host: str) -> dict[str, tuple[bool, str]]:
        admin = {link.ifname: link.admin_up for link in _links(self.transports[host], self.timeout_s)}
        rdma = {(r.dev, r.port): r.state for r in _rdma_links(self.transports[host], self.timeout_s)}
        return {p.key: (admin.get(p.netdev, False), rdma.get((p.rdma_dev, p.rdma_port), "?"))
                for p in self.ports if p.host == host}

    def states(self) -> dict[str, tuple[bool, str]]:
        """NIC key -> (administratively up, RDMA port state), every host read in parallel."""
        return {k: v for part in self._pool.map(self._states_on, self.transports) for k, v in part.items()}

    def set_admin(self, port: NicPort, up: bool) -> None:
        command = self.link_command.format(netdev=shlex.quote(port.netdev), state="up" if up else "down")
        self.transports[port.host].run(command, deadline=Deadline(self.timeout_s), check=True)

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
    identified: list[str] = field(default_factory=list)  # NIC keys whose own light was seen on their claimed ingress
    unverified: list[str] = field(default_factory=list)  # why a NIC's TX identity could not be checked
    identity_by: str = ""  # what watched the ingresses while each NIC was set down
    restored: bool = False
    restore_error: str | None = None
    links_restored: bool = False  # every NIC's admin and RDMA port state read back as before the check
    links_error: str | None = None

    @property
    def passed(self) -> bool:
        return not self.findings and self.restored and self.links_restored


def _name(port: NicPort) -> str:
    return f"{port.host}/{port.netdev}"


def fibre_map(bench: Bench, ocs: str, *, light_s: float = 2.0, poll_s: float = 0.01,
              timeout_s: float = 10.0, laser_s: float = 10.0, link_s: float = 30.0,
              link_command: str = LINK_COMMAND) -> FibreReport:
    """Check every fibre of the NIC ports on `ocs` (see the module doc). Touches allowed ports and inventory
    NICs only (the driver refuses other ports before sending); the caller holds the bench lease.
    `laser_s` bounds a laser's return after `ip link set up` (a QSFP-DD module leaves low power in seconds);
    `link_s` bounds the links' return to their earlier states once the cross-connects are restored;
    `link_command` sets a NIC down or up (`{netdev}`, `{state}`)."""
    from devices.ocs import open_switch
    from harness.bench.circuits import CircuitGuard, RetryPolicy

    resource = bench.ocs[ocs]
    ports = [p for p in bench.nic_ports if p.ocs == ocs]
    n_in = resource.size[0]
    report = FibreReport(ocs)
    switch = open_switch(resource, timeout_s=timeout_s)
    nics = None
    before: dict[str, tuple[bool, str]] = {}
    guard = CircuitGuard(ocs, switch, snapshot_path=None, resuming=False)
    policy = RetryPolicy(timeout_s=timeout_s)
    cache: dict[tuple[int, int], frozenset[str]] = {}
    try:
        nics = _Nics(bench, ports, timeout_s, check_link_command(link_command))
        before = nics.states()
        guard.apply({}, policy, exclusive=True)
        nics.wait(lambda lit: not lit, light_s, poll_s)

        def test(ingress: int, egress: int) -> frozenset[str]:
            if (ingress, egress) not in cache:
                guard.apply({ingress: egress}, policy, exclusive=True)
                lit = nics.wait(bool, light_s, poll_s)
                guard.apply({}, policy, exclusive=True)
                nics.wait(lambda now: not now, light_s, poll_s)
                cache[(ingress, egress)] = lit
                report.tests.append((ingress, egress, sorted(lit)))
            return cache[(ingress, egress)]

        failing = []
        for port in ports:
            (report.ok.append(port.key) if test(port.ocs_tx, port.ocs_rx) == {port.key} else failing.append(port))
        good = [p for p in ports if p.key in report.ok]
        allowed_in = sorted(p for p in resource.allowed_ports if p <= n_in)
        allowed_out = sorted(p for p in resource.allowed_ports if p > n_in)
        tx_named: set[str] = set()  # NICs whose TX fibre light already placed elsewhere
        if failing and not good:
            report.findings += [f"{_name(p)}: its loop OCS {p.ocs_tx}->{p.ocs_rx} lit "
                                f"{', '.join(k.replace(':', '/', 1) for k in sorted(cache[(p.ocs_tx, p.ocs_rx)])) or 'nothing'}"
                                "; no NIC passed to localise against" for p in failing]
            failing = []
        claimed_in = {p.ocs_tx for p in ports}
        for port in failing:
            ref = good[0]
            if ref.key not in test(port.ocs_tx, ref.ocs_rx):
                # light from a TX fibre sits on an ingress no NIC claims (a claimed one is its owner's)
                spare = [i for i in allowed_in if i not in claimed_in]
                seen = [i for i in spare if ref.key in test(i, ref.ocs_rx)]
                tx_named.add(port.key)
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
        _tx_identity(switch, lambda mapping: guard.apply(mapping, policy, exclusive=True), nics,
                     [p for p in ports if p.key not in tx_named], good, before, allowed_in, report,
                     light_s=light_s, laser_s=laser_s, poll_s=poll_s)
        return report
    finally:
        outcome = guard.restore(within_s=max(15.0, timeout_s))
        report.restored, report.restore_error = outcome.restored, outcome.error
        if nics is not None:
            _links_as_before(nics, before, report, link_s, poll_s)
            nics.close()
        switch.close()


@contextlib.contextmanager
def _set_down(nics: _Nics, port: NicPort):
    """`port` administratively down for the block, up again however the block ends."""
    nics.set_admin(port, False)
    try:
        yield
    finally:
        nics.set_admin(port, True)


def _until(read, done, within_s: float, poll_s: float) -> frozenset[int]:
    deadline = Deadline(within_s)
    while True:
        now = read()
        if done(now) or deadline.expired():
            return now
        time.sleep(poll_s)


def _tx_identity(switch, connect, nics: _Nics, ports: list[NicPort], good: list[NicPort], before: dict,
                 allowed_in: list[int], report: FibreReport, *, light_s: float, laser_s: float,
                 poll_s: float) -> None:
    """Whose light is on each claimed ingress: each NIC set down in turn, the ingress that goes dark is its TX
    fibre; set up again, that light must return within `laser_s`. The ingresses are watched by the switch's
    own power monitors; where it reports none, by NIC receivers that passed their loop, the ingresses
    connected onto them in batches (never onto the probed NIC's own receiver: a module in low power may
    flag LOS whatever light it gets)."""
    def lit_on_switch() -> frozenset[int]:
        return frozenset(p for p, dbm in switch.port_power(allowed_in).items() if dbm > LIT_DBM)

    def by_power(port):
        yield lit_on_switch

    def by_receivers(port):
        meters = [g for g in good if g.key != port.key]
        order = [port.ocs_tx] + [p.ocs_tx for p in ports if p.ocs_tx != port.ocs_tx]
        for k in range(0, len(order), max(1, len(meters))):
            meter_of = dict(zip(order[k:k + len(meters)], meters))
            connect({i: m.ocs_rx for i, m in meter_of.items()})
            keys = {m.key for m in meter_of.values()}
            nics.wait(lambda lit: keys <= lit, light_s, poll_s)
            yield lambda: frozenset(i for i, m in meter_of.items() if m.key in nics.lit())

    try:
        lit_on_switch()
        batches, report.identity_by = by_power, "the switch's ingress power monitors"
    except DeviceError as exc:
        batches = by_receivers
        report.identity_by = f"NIC receivers (the switch reports no ingress power: {str(exc)[:120]})"
    owner = {p.ocs_tx: p for p in ports}
    for port in ports:
        if not before.get(port.key, (False, ""))[0]:
            report.unverified.append(f"{_name(port)}: administratively down before the check (transmits nothing)")
            continue
        if batches is by_receivers and not [g for g in good if g.key != port.key]:
            report.unverified.append(f"{_name(port)}: no other NIC passed its loop to watch this one's light")
            continue
        dark = gone = frozenset()
        try:
            for read in batches(port):
                base = read()
                with _set_down(nics, port):
                    dark = base - _until(read, lambda now: bool(base - now), light_s, poll_s)
                gone = base - _until(read, lambda now: base <= now, laser_s, poll_s)
                if dark or gone:
                    break
        except CommandFailed as exc:  # e.g. RTNETLINK answers: Operation not permitted (needs CAP_NET_ADMIN)
            report.unverified.append(f"{_name(port)}: cannot set it down and up: {exc}")
            continue
        if gone:
            report.findings.append(f"{_name(port)}: light on OCS {', '.join(map(str, sorted(gone)))} "
                                   f"did not return within {laser_s:g} s of `ip link set up`")
        if dark == {port.ocs_tx}:
            report.identified.append(port.key)
        elif not dark:
            report.unverified.append(f"{_name(port)}: set down, no watched ingress went dark (its laser stays on when "
                                     f"the port is down, or its fibre is on a port not watched and the light on OCS "
                                     f"{port.ocs_tx} is another NIC's)")
        else:
            others = [f"OCS {i} is claimed by {_name(owner[i])}" for i in sorted(dark) if i in owner and i != port.ocs_tx]
            report.findings.append(f"inventory says {_name(port)} tx→OCS {port.ocs_tx}, light seen on OCS "
                                   f"{', '.join(map(str, sorted(dark)))} (dark while it was set down"
                                   + (f"; {'; '.join(others)})" if others else ")"))


def _links_as_before(nics: _Nics, before: dict, report: FibreReport, link_s: float, poll_s: float) -> None:
    """Every NIC's admin state and RDMA port state read back as before the check (links re-train once the
    cross-connects are back: wait for them, bounded)."""
    try:
        now = nics.states()
        for port in nics.ports:  # a port the check set down and could not set up again gets another try
            if before.get(port.key, (False, ""))[0] and not now.get(port.key, (False, ""))[0]:
                nics.set_admin(port, True)
        deadline = Deadline(link_s)
        while True:
            now = nics.states()
            differ = sorted(k for k in before if now.get(k) != before[k])
            if not differ or deadline.expired():
                break
            time.sleep(max(poll_s, 0.05))
    except (DeviceError, ParseError) as exc:
        report.links_error = f"cannot read the links back: {exc}"
        return
    report.links_restored = not differ
    if differ:
        show = lambda st: f"{'up' if st[0] else 'down'}/{st[1]}"  # noqa: E731
        report.links_error = "; ".join(f"{k.replace(':', '/', 1)} {show(before[k])} before, {show(now.get(k, (False, '?')))} "
                                       f"after {link_s:g} s" for k in differ)


# ====================================================================== discovery


# ibstat's words for a port's state, as `rdma link` prints them (ibv_devinfo's only lose their `PORT_`, ibstatus
# prints the sysfs codes, which index iproute2's table)
_IBSTAT_STATES = {"Active": "ACTIVE", "Down": "DOWN", "Initializing": "INIT", "Armed": "ARMED"}
_IBSTAT_PHYS = {"LinkUp": "LINK_UP", "Polling": "POLLING", "Disabled": "DISABLED", "Sleep": "SLEEP",
                "LinkErrorRecovery": "LINK_ERROR_RECOVER", "PortConfigurationTraining": "ARMED"}


def _ports_from_ibstat(text: str) -> list[tuple[str, int, str, str]]:
    return [(p.ca, p.port, _IBSTAT_STATES.get(p.state, p.state.upper()), _IBSTAT_PHYS.get(p.physical_state,
             p.physical_state.upper())) for p in parse_ibstat(text)]


def _ports_from_ibv_devinfo(text: str) -> list[tuple[str, int, str, str]]:
    return [(d.hca_id, p.port, p.state.removeprefix("PORT_"), p.phys_state or "UNKNOWN")
            for d in parse_ibv_devinfo(text) for p in d.ports]


def _ports_from_ibstatus(text: str) -> list[tuple[str, int, str, str]]:
    words = dict(enumerate(RDMA_PHYS_STATES))
    return [(p.dev, p.port, p.state.name, words.get(p.phys_state.code, p.phys_state.name))
            for p in parse_ibstatus(text)]


_PORT_TOOLS = (("ibstat", _ports_from_ibstat), ("ibv_devinfo", _ports_from_ibv_devinfo),
               ("ibstatus", _ports_from_ibstatus))


def _rdma_ports(transport: SshTransport, run: Callable[[str], str], timeout_s: float) -> tuple[list[RdmaLink], str]:
    """The host's RDMA ports and the tool that told: `rdma link` where iproute2 has it, else the first of ibstat,
    ibv_devinfo and ibstatus that answers, with each port's netdev from `ibdev2netdev` or, failing that, the
    one entry of sysfs `/sys/class/infiniband/DEV/device/net`. ([], why) when none answers."""
    try:
        return _rdma_links(transport, timeout_s), "rdma link"
    except (CommandFailed, ParseError):
        pass
    for command, read in _PORT_TOOLS:
        text = run(command)
        try:
            ports = read(text) if text else None
        except ParseError:
            ports = None
        if not ports:
            continue
        netdevs: dict[tuple[str, int], str] = {}
        with contextlib.suppress(ParseError):
            netdevs = {(x.dev, x.port): x.netdev for x in parse_ibdev2netdev(run("ibdev2netdev"))}
        found = f"{command} + ibdev2netdev" if netdevs else command
        if not netdevs:
            for dev in sorted({dev for dev, *_ in ports}):
                names = run(f"ls /sys/class/infiniband/{shlex.quote(dev)}/device/net").split()
                if len(names) == 1:
                    netdevs.update({(dev, port): names[0] for d, port, *_ in ports if d == dev})
            found += " + sysfs" if netdevs else ""
        return [RdmaLink(dev, port, state, phys, netdevs.get((dev, port))) for dev, port, state, phys in ports], found
    return [], "none of rdma, ibstat, ibv_devinfo, ibstatus answered"


def _gpus(run: Callable[[str], str]) -> tuple[list[dict], str | None]:
    """The host's GPUs from `nvidia-smi --query-gpu`, else from the default `nvidia-smi` table (no UUID there);
    ([], None) where neither answers."""
    query = run("nvidia-smi --query-gpu=index,name,pci.bus_id,uuid --format=csv,noheader")
    with contextlib.suppress(ParseError):
        if query:
            rows = parse_nvidia_smi_csv(query, ["index", "name", "pci.bus_id", "uuid"], header=False).records()
            return [{"index": int(row["index"]), "name": row["name"], "pci_bus_id": row["pci.bus_id"],
                     "uuid": row["uuid"]} for row in rows], "nvidia-smi --query-gpu"
    table = run("nvidia-smi")
    with contextlib.suppress(ParseError):
        if table:
            return [{"index": g.index, "name": g.name, "pci_bus_id": g.bus_id, "uuid": None}
                    for g in parse_nvidia_smi_table(table).gpus], "nvidia-smi"
    return [], None


def discover_host(host: HostResource, *, timeout_s: float = 10.0) -> dict:
    """What one host reports: hostname, RDMA ports with their netdevs and transceivers, GPUs and the GPUs
    closest to each NIC (`nvidia-smi topo -m`; no GPUs where nvidia-smi is missing), and `found_by`: the tool
    that answered for the RDMA ports and for the GPUs (the fallbacks when `rdma` or `--query-gpu` do not)."""
    transport = _transport(host, timeout_s)
    try:
        def run(command: str, check: bool = False) -> str:
            result = transport.run(command, deadline=Deadline(timeout_s), check=check)
            return result.stdout if result.exit_status == 0 else ""

        hostname = run("hostname", check=True).strip() or host.name
        links = {link.ifname: link for link in _links(transport, timeout_s)}
        rdma_ports, ports_by = _rdma_ports(transport, run, timeout_s)
        nics = []
        for r in rdma_ports:
            nic = {"netdev": r.netdev, "rdma_dev": r.dev, "rdma_port": r.port, "state": r.state,
                   "mac": links[r.netdev].mac if r.netdev in links else None}
            module_text = run(f"ethtool -m {shlex.quote(r.netdev)}") if r.netdev else ""
            if module_text:
                m = parse_ethtool_module(module_text)
                nic["transceiver"] = {"vendor": m.vendor_name, "part": m.vendor_pn, "serial": m.vendor_sn,
                                      "type": f"0x{m.identifier:02x}" if m.identifier is not None else None}
            nics.append(nic)
        gpus, gpus_by = _gpus(run)
        if gpus:
            topo_text = run("nvidia-smi topo -m")
            if topo_text:
                topo = parse_nvidia_smi_topo(topo_text)
                for nic in nics:
                    nic["closest_gpus"] = [int(g[3:]) for g in topo.closest_gpus(nic["rdma_dev"])]
        return {"hostname": hostname, "nics": nics, "gpus": gpus,
                "found_by": {"rdma_ports": ports_by, "gpus": gpus_by or "no nvidia-smi answered"}}
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
