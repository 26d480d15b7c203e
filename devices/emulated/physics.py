"""The physical truth of the emulated bench: switch mirrors, fibres, host clocks, and the composition of the
NIC port state machines (devices/emulated/nic.py) and the schedule they run on (devices/emulated/schedule.py).

Protocol servers (TL1/SCPI/NETCONF, SSH hosts) are thin views over one `OpticalBench`. State changes are actions
on the schedule, each run with its DUE time: a late scheduler thread (a busy machine) cannot reorder cause and
effect or stretch the profile's delays. Every reader (snapshots, port power, ground truth, the next command)
first runs whatever is due, so the state it sees is the state at "now" on the schedule. Late running is recorded (`lateness()`, `schedule_report()`).
Ground truth is appended with due times on the harness clock (CLOCK_MONOTONIC).

Every random delay comes from a stream keyed by (seed, command, port, stage) — `command` is the switch
command that moved the mirror (one or two per harness cycle), so the same seed and the same commands give
identical delays whatever the thread timing (`draws()` lists them).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from devices.emulated.columns import Column
from devices.emulated.nic import (CMIS_RESET, DARK_DBM, NicChange, NicModel, NicSnapshot, NicStateMachine, Port,
                                  Subscribers)
from devices.emulated.profile import NIC_KEYS, OCS_KEYS, OPTIONAL_NIC_KEYS, Profile
from devices.emulated.schedule import Schedule
from devices.emulated.truth import TruthLog
from devices.timing import now_ns

WIRE_LATENCY_NS = 2_000  # fibre + serialisation of one probe frame
DRAW_BLOCK = 1 << 20  # draws read at once when reporting on them
# Stream key of every random quantity: (domain, command, stage) -> one value per port (or per host).
# The optional stages come last: the others keep their codes, so a profile without them draws as before.
_STREAM_STAGES = OCS_KEYS + NIC_KEYS + ("clock_offset", "clock_drift") + OPTIONAL_NIC_KEYS
_STAGE_CODE = {stage: i for i, stage in enumerate(_STREAM_STAGES)}
_OCS, _NIC, _CLOCK, _ADMIN = 0, 1, 2, 3  # _ADMIN: re-training after `ip link set up` (its own streams)


class OcsRefusal(Exception):
    """The switch refuses a command, for a reason of `kind` (one of KINDS; each protocol server says it in its
    own words: TL1 error codes, SCPI error numbers, NETCONF error tags); `text` is the switch's comment."""

    KINDS = frozenset({
        "invalid_port",  # not a port of this switch, or not of the side the command needs
        "port_in_use",  # an ingress already connected
        "egress_in_use",  # an egress already connected, or named twice in one command
        "no_patch",  # removing a connection that is not there
        "listed_twice",  # an ingress named twice in one command
        "lists_differ",  # ingress and egress lists of different lengths
        "unsupported",  # a request the emulated switch does not offer
        "not_equipped",  # the unit lacks the hardware (e.g. no optical power monitor)
    })

    def __init__(self, kind: str, text: str):
        if kind not in self.KINDS:
            raise TypeError(f"unknown refusal kind {kind!r}; expected one of {sorted(self.KINDS)}")
        super().__init__(f"{kind}: {text}")
        self.kind, self.text = kind, text


class KeyedStreams:
    """Uniform draws keyed by (seed, domain, command, stage, index): SeedSequence spawn keys, so a value depends
    on its key alone, never on how many draws came before it. One block of `size` values per
    (domain, command, stage), cached while recent."""

    _KEEP = 256

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._blocks: dict[tuple[int, int, int], np.ndarray] = {}

    def uniform(self, domain: int, command: int, stage: str, index: int, size: int) -> float:
        key = (domain, command, _STAGE_CODE[stage])
        block = self._blocks.get(key)
        if block is None or len(block) < size:
            words = np.random.SeedSequence(self.seed, spawn_key=key).generate_state(size, np.uint64)
            block = (words >> np.uint64(11)).astype(np.float64) * 2.0**-53  # [0, 1) with 53 bits
            self._blocks[key] = block
            if len(self._blocks) > self._KEEP:
                del self._blocks[next(iter(self._blocks))]
        return float(block[index])


@dataclass
class _HostClock:
    epoch_ns: int
    offset_ns: int
    drift_ppm: float
    t0_ns: int
    step_ns: int = 0

    def at(self, mono_ns: int) -> int:
        drift = int(self.drift_ppm * 1e-6 * (mono_ns - self.t0_ns))
        return mono_ns + self.epoch_ns + self.offset_ns + self.step_ns + drift


def _fibre_swaps(pairs: list, n_in: int) -> dict[int, int]:
    """{port: port its fibre really lands on} for `miscable: [[a, b], ...]`; a port in two pairs or a pair
    across ingress and egress is refused."""
    swap: dict[int, int] = {}
    for pair in pairs:
        a, b = (int(x) for x in pair)
        if a == b or a in swap or b in swap or (a <= n_in) != (b <= n_in):
            raise ValueError(f"miscable: {[a, b]} must be two distinct ports, both ingress or both egress, "
                             "each in one pair")
        swap[a], swap[b] = b, a
    return swap


class OpticalBench:
    """One N×M switch, `hosts × nics_per_host` NIC ports, each NIC's TX on an ingress and RX on an egress."""

    def __init__(self, profile: Profile, seed: int = 0, host_prefix: str = "gpu",
                 clock: Callable[[], int] = now_ns, miscable: Iterable[Sequence[int]] = ()):
        self.profile = profile
        self._streams = KeyedStreams(seed)
        self._now = clock  # CLOCK_MONOTONIC ns; tests pass a fake clock to make the scheduler late at will
        # switch commands that moved a mirror, counted per switch: the "cycle" part of the stream keys, so that two
        # switches over this physics draw the same whichever command reaches its server first
        self._commands: dict[int, int] = {}
        # Every draw, column-wise (a pod draws ~10^4 per cycle): command, port index (-1: the switch), stage
        # code, delay, and how late the action it timed ran and when it was due (the schedule fills those in;
        # due -1 until it ran).
        self._draws = {k: Column(t) for k, t in (("command", "q"), ("port", "l"), ("stage", "b"), ("delay_ns", "q"),
                                                 ("late_ns", "q"), ("due_ns", "q"))}
        topo = profile.topology
        self.ocs_size = topo.ocs_size
        n_in = topo.ocs_size[0]
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._schedule = Schedule(clock, self._wake, self._draws["late_ns"], self._draws["due_ns"])
        self._patches: dict[int, int] = {}  # commanded: ingress -> egress
        self._settled: dict[int, int] = {}  # mirrors in place: ingress -> egress
        self._settled_to: dict[int, int] = {}  # mirrors in place: egress -> ingress (O(1) peer lookup)
        self._lit_egress: set[int] = set()
        self._truth = TruthLog()
        self._nic = NicStateMachine(
            profile, at=self._schedule.at, draw=self._draw, truth=self._truth,
            far_end=lambda port: self._settled_to.get(port.model.ocs_rx), peer_of=self._peer_of,
            link_changed=lambda t, port: self._update_data_plane(t, self._dp_affected(port)))
        self._subs = Subscribers()
        # Observers of mirror moves, called (t_ns, ingress, egress, settled) on the scheduler thread with
        # the bench lock held: they must return quickly and not call back into the bench.
        self.on_mirror: list[Callable[[int, int, int, bool], None]] = []
        self.on_clock_step: list[Callable[[str], None]] = []  # called (host) after a clock step, no lock held
        self._thread: threading.Thread | None = None
        self._stop = False
        self.hosts = [f"{host_prefix}{h + 1}" for h in range(topo.hosts)]
        self._ports: dict[tuple[str, str], Port] = {}
        epoch = time.time_ns() - time.monotonic_ns()
        start = self._now()
        lo, hi = profile.clock_offset_ms
        dlo, dhi = profile.drift_ppm
        draw = lambda stage, h: self._streams.uniform(_CLOCK, 0, stage, h, len(self.hosts))  # noqa: E731
        self._clocks = {h: _HostClock(epoch, int((lo + (hi - lo) * draw("clock_offset", i)) * 1e6),
                                      float(dlo + (dhi - dlo) * draw("clock_drift", i)), start)
                        for i, h in enumerate(self.hosts)}
        # Mis-cabling: each pair [a, b] swaps the fibres at OCS ports a and b (both ingress or both egress).
        # `cabled_as` keeps the intended cabling — what the inventory claims; the models carry the real one.
        swap = _fibre_swaps(list(miscable) + list(profile.faults.get("miscable") or []), n_in)
        self.cabled_as: dict[str, tuple[int, int]] = {}
        for i in range(topo.nic_count):
            h, j = divmod(i, topo.nics_per_host)
            host = self.hosts[h]
            tx, rx = i + 1, n_in + i + 1
            model = NicModel(host=host, netdev=f"ens{j + 1}f0np0", rdma_dev=f"mlx5_{j}", rdma_port=1,
                             mac=f"0c:42:a1:{h:02x}:{j:02x}:01", ifindex=3 + j, ocs_tx=swap.get(tx, tx),
                             ocs_rx=swap.get(rx, rx))
            self.cabled_as[model.key] = (tx, rx)
            self._ports[(host, model.netdev)] = Port(model, index=i, cmis=profile.has_cmis(model.key))
            if self._ports[(host, model.netdev)].cmis:  # dark at start: reset, as after a light loss
                self._ports[(host, model.netdev)].state = NicSnapshot(**CMIS_RESET)
        self._host_ports: dict[str, list[Port]] = {h: [] for h in self.hosts}  # O(NICs of the host) lookups
        for port in self._ports.values():
            self._host_ports[port.model.host].append(port)
        self._by_rx = {p.model.ocs_rx: p for p in self._ports.values()}
        self._by_tx = {p.model.ocs_tx: p for p in self._ports.values()}
        self._lit_ingress = set(self._by_tx)  # every NIC laser is on
        self._admin_changes = 0  # `ip link set` calls that changed a port: the command part of their draws
        for key in profile.faults.get("never_up") or []:
            self._port_by_key(str(key)).fault = "never_up"
        for key in profile.faults.get("flap") or []:
            port = self._port_by_key(str(key))
            port.fault, port.flaps = "flap", 3

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "OpticalBench":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="optical-bench", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._stop and not self._nic.pending:
                    due = self._schedule.next_due()
                    if due is not None:
                        wait = (due - self._now()) / 1e9
                        if wait <= 0:
                            break
                        self._wake.wait(wait)
                    else:
                        self._wake.wait()
                if self._stop:
                    return
                self._advance(observed=False)  # pushed changes carry their due times: no state read here
                pending, self._nic.pending = self._nic.pending, []
                subs = self._subs.snapshot()  # with the changes: a later subscriber gets none of them
            Subscribers.deliver(pending, subs)  # outside the lock: a subscriber may read snapshots

    def _advance(self, observed: bool = True) -> None:
        """Run every action due by now (Schedule.run_due). Caller holds the lock, and reads the state at now
        (`observed`) unless it only changes it."""
        self._schedule.run_due(observed)
        if self._nic.pending:
            self._wake.notify()  # the scheduler thread delivers the changes

    def _draw(self, domain: int, command: int, stage: str, delay, port: Port | None = None) -> tuple[int, int]:
        """(delay ns, draw index) of `delay` from the stream keyed (seed, command, port index, stage)."""
        index, size = (0, 1) if port is None else (port.index, len(self._ports))
        ns = int(delay.at_quantile(self._streams.uniform(domain, command, stage, index, size)) * 1e9)
        cols = self._draws
        cols["command"].append(command)
        cols["port"].append(index if port is not None else -1)
        cols["stage"].append(_STAGE_CODE[stage])
        cols["delay_ns"].append(ns)
        cols["late_ns"].append(0)
        cols["due_ns"].append(-1)
        return ns, len(cols["delay_ns"]) - 1

    # ------------------------------------------------------------------ OCS view
    def ocs_patches(self) -> dict[int, int]:
        with self._lock:
            self._advance()
            return dict(self._patches)

    def ocs_apply(self, adds: dict[int, int], removes: Iterable[int] = (), at_ns: int | None = None,
                  switch: int = 0) -> int:
        """Validate, then move mirrors. Returns the monotonic ns when every moved mirror has settled.

        `switch`: which switch over this physics sent it (devices.emulated.bench.SwitchSlice); its commands are
        counted on their own, the first switch's keyed exactly as a lone switch's.

        `at_ns`: when the command reached the switch (a server's kernel receive stamp). The mirrors move from
        then, not from when a busy machine let the server's thread get to it — as far back as no reader has
        seen the state since (every change it makes falls after the last read)."""
        removes = list(removes)
        n, m = self.ocs_size
        with self._lock:
            self._advance(observed=False)
            for port in list(removes) + list(adds):
                if not 1 <= port <= n:
                    raise OcsRefusal("invalid_port", f"Invalid ingress port {port}")
            for egress in adds.values():
                if not n < egress <= n + m:
                    raise OcsRefusal("invalid_port", f"Invalid egress port {egress}")
            if len(set(removes)) != len(removes):
                raise OcsRefusal("listed_twice", "Port listed twice")
            for ingress in removes:
                if ingress not in self._patches:
                    raise OcsRefusal("no_patch", f"No patch on port {ingress}")
            remaining = {i: e for i, e in self._patches.items() if i not in set(removes)}
            used_egress = set(remaining.values())
            if len(set(adds.values())) != len(adds):
                raise OcsRefusal("egress_in_use", "Egress port used twice in one command")
            for ingress, egress in adds.items():
                if ingress in remaining:
                    raise OcsRefusal("port_in_use", f"Port {ingress} already connected to {remaining[ingress]}")
                if egress in used_egress:
                    raise OcsRefusal("egress_in_use", f"Port {egress} already connected")
            t0 = self._now()
            if not (adds or removes):
                return t0
            count = self._commands[switch] = self._commands.get(switch, 0) + 1
            command = count + (switch << 40)
            # when the command had surely reached the switch (the server's kernel stamp plus its conversion's bound;
            # else when it was handled, later — `port` says which): what the harness's recorded send must precede
            # (analysis.accuracy.ocs_command_check)
            self._truth.append(t0 if at_ns is None else at_ns, "ocs_command_arrived", "ocs",
                               "handled" if at_ns is None else "kernel", 0)
            dark, dark_draw = self._draw(_OCS, command, "dark", self.profile.ocs["dark"]) if removes else (0, -1)
            base, base_draw = self._draw(_OCS, command, "switch", self.profile.ocs["switch"]) if adds else (0, -1)
            if at_ns is not None:
                first = min(d for d, on in ((dark, removes), (base, adds)) if on)
                t0 = min(t0, max(at_ns, max(self._schedule.observed_ns, self._schedule.ran_ns) - first + 1))
            if removes:
                for ingress in removes:
                    egress = self._patches.pop(ingress)
                    self._schedule.at(t0 + dark, lambda t, i=ingress, e=egress: self._mirror_away(t, i, e, command),
                             dark_draw)
            settle = t0
            if adds:
                settle = t0 + base
                draw = base_draw
                for ingress, egress in adds.items():
                    self._patches[ingress] = egress
                    self._schedule.at(settle, lambda t, i=ingress, e=egress: self._mirror_settled(t, i, e, command),
                                      draw)
            return settle

    def ocs_port_power(self, port: int) -> float:
        n, _ = self.ocs_size
        with self._lock:
            self._advance()
            if port <= n:
                return 1.0 if port in self._lit_ingress else DARK_DBM
            if port in self._lit_egress:
                return -3.0 - 0.05 * (port % 7)  # a per-port insertion loss, stable across runs
            return DARK_DBM

    def _mirror_away(self, t: int, ingress: int, egress: int, command: int) -> None:
        if self._settled.get(ingress) == egress:
            del self._settled[ingress]
            if self._settled_to.get(egress) == ingress:
                del self._settled_to[egress]
                # another mirror may already have settled onto this egress (a fast switch, a slow release)
                for other, e in self._settled.items():
                    if e == egress:
                        self._settled_to[egress] = other
        self._truth.append(t, "mirror_released", "ocs", str(egress), egress)
        for observer in self.on_mirror:
            observer(t, ingress, egress, False)
        self._set_light(t, egress, command)

    def _mirror_settled(self, t: int, ingress: int, egress: int, command: int) -> None:
        if self._patches.get(ingress) != egress:
            return  # superseded before it settled
        self._settled[ingress] = egress
        self._settled_to[egress] = ingress
        self._truth.append(t, "mirror_settled", "ocs", str(egress), egress)
        for observer in self.on_mirror:
            observer(t, ingress, egress, True)
        self._set_light(t, egress, command)

    def _set_light(self, t: int, egress: int, command: int, domain: int = _NIC) -> None:
        """Egress `egress` is lit iff a settled mirror points a lit ingress at it."""
        source = self._settled_to.get(egress)
        on = source is not None and source in self._lit_ingress
        port = self._by_rx.get(egress)
        if on != (egress in self._lit_egress):
            (self._lit_egress.add if on else self._lit_egress.discard)(egress)
            if port is not None:
                self._nic.light_changed(port, t, on, command, domain)
        elif on and port is not None and self._nic.link_up(port) and port.trained_on != source:
            self._nic.light_changed(port, t, on, command, domain)  # another transmitter, never dark between
        if port is not None:
            self._update_data_plane(t, (port,))  # its peer may have changed even where the light did not

    # ------------------------------------------------------------------ data plane (probes)
    def _peer_of(self, port: Port) -> Port | None:
        """The NIC whose transmitter currently lights this port's receiver."""
        ingress = self._settled_to.get(port.model.ocs_rx)
        return None if ingress is None else self._by_tx.get(ingress)

    def _receiver_of(self, port: Port) -> Port | None:
        """The NIC whose receiver this port's transmitter currently lights."""
        egress = self._settled.get(port.model.ocs_tx)
        return None if egress is None else self._by_rx.get(egress)

    def _dp_affected(self, port: Port) -> tuple[Port, ...]:
        """Receivers whose probe path depends on `port`'s state: itself and the port it transmits to."""
        receiver = self._receiver_of(port)
        return (port,) if receiver is None or receiver is port else (port, receiver)

    def _update_data_plane(self, t: int, ports: Iterable[Port]) -> None:
        """Re-evaluate, for the given receiving ports (those whose path just changed), whether probes from
        their peer get through: O(changed ports), not O(ports²)."""
        for port in ports:
            peer = self._peer_of(port) if port.model.ocs_rx in self._lit_egress else None
            up = (peer is not None and peer.probe_interval_ns > 0 and port.state.ib_state == "ACTIVE"
                  and peer.state.ib_state == "ACTIVE")
            if up == port.dp_up:
                continue
            port.dp_up = up
            port.dp_gen += 1
            port.dp_flow = None
            if up:
                interval, t0 = peer.probe_interval_ns, peer.probe_t0_ns
                seq = -(-(t - t0) // interval)  # first send tick at or after t
                arrival = t0 + seq * interval + WIRE_LATENCY_NS
                port.dp_flow = (peer.model.mac, seq, arrival, interval)
                gen = port.dp_gen

                def first(t_now, port=port, peer=peer, seq=seq, gen=gen):
                    if port.dp_gen != gen:
                        return
                    self._nic.pending.append(NicChange(t_now, port.model.host, port.model.netdev, "probe_first",
                                                   f"{peer.model.mac} {seq}"))
                    self._truth.append(t_now, "first_packet", port.model.host, port.model.netdev,
                                       port.model.ocs_rx)

                self._schedule.at(arrival, first)

    def probe_start(self, host: str, netdev: str, interval_ns: int) -> None:
        if interval_ns <= 0:
            raise ValueError("probe interval must be > 0")
        with self._lock:
            self._advance()
            port = self._port(host, netdev)
            port.probe_interval_ns, port.probe_t0_ns = int(interval_ns), self._now()
            self._schedule.at(port.probe_t0_ns, lambda t: self._update_data_plane(t, self._dp_affected(port)))

    def probing(self, host: str, netdev: str) -> bool:
        """Whether the port's probe sender is running."""
        with self._lock:
            return self._port(host, netdev).probe_interval_ns > 0

    def probe_flow(self, host: str, netdev: str) -> tuple[str, int, int, int] | None:
        """The probes reaching this port: (sender MAC, seq of the flow's first, its arrival ns, interval ns),
        the k-th next arriving at arrival + k·interval; None while none get through."""
        with self._lock:
            self._advance()
            return self._port(host, netdev).dp_flow

    def probe_stop(self, host: str, netdev: str) -> None:
        with self._lock:
            self._advance()
            port = self._port(host, netdev)
            port.probe_interval_ns = 0
            self._schedule.at(self._now(), lambda t: self._update_data_plane(t, self._dp_affected(port)))

    # ------------------------------------------------------------------ host view
    def _port(self, host: str, netdev: str) -> Port:
        try:
            return self._ports[(host, netdev)]
        except KeyError:
            raise KeyError(f"no NIC {netdev} on host {host}") from None

    def _port_by_key(self, key: str) -> Port:
        host, _, netdev = key.partition(":")
        return self._port(host, netdev)

    def nic_ports(self, host: str) -> list[NicModel]:
        return [p.model for p in self._host_ports.get(host, ())]

    def all_nic_ports(self) -> list[NicModel]:
        return [p.model for p in self._ports.values()]

    def nic_snapshot(self, host: str, netdev: str) -> NicSnapshot:
        with self._lock:
            self._advance()
            return self._port(host, netdev).state

    def nic_states(self) -> tuple[int, dict[str, NicSnapshot]]:
        """(now on the schedule, every NIC port's state then)."""
        with self._lock:
            now = self._now()
            self._advance()  # runs everything due by `now` (it reads the clock after us): undo what is later
            states = {p.model.key: p.state for p in self._ports.values()}
            later: set[str] = set()  # ports whose state moved past `now`: their last state by `now` instead
            for t, key, state in reversed(self._nic.rate_log):  # due order
                if t > now:
                    later.add(key)
                elif not later:
                    break
                elif key in later:
                    states[key] = NicSnapshot._make(state)
                    later.discard(key)
            return now, states

    def nic_changes(self, since_ns: int) -> tuple[int, list[tuple[int, str, NicSnapshot]]]:
        """(now on the schedule, the (due ns, "host:netdev", state) changes of light, PHY and port state in
        (since_ns, now], in due order)."""
        with self._lock:
            now = self._now()
            self._advance()
            out = []
            for t, key, state in reversed(self._nic.rate_log):
                if t <= since_ns:
                    break
                if t <= now:
                    out.append((t, key, NicSnapshot._make(state)))
            return now, out[::-1]

    def nic_snapshots(self, host: str) -> list[tuple[NicModel, NicSnapshot]]:
        """Every NIC port of `host` with its state, read at one instant of the schedule."""
        with self._lock:
            self._advance()
            return [(p.model, p.state) for p in self._host_ports.get(host, ())]

    def host_time(self, host: str, mono_ns: int) -> int:
        return self._clocks[host].at(mono_ns)

    def host_clock_ns(self, host: str) -> int:
        return self._clocks[host].at(self._now())

    def host_clock_params(self, host: str) -> dict:
        c = self._clocks[host]
        return {"offset_ns": c.offset_ns + c.step_ns, "drift_ppm": c.drift_ppm, "t0_ns": c.t0_ns,
                "epoch_ns": c.epoch_ns}

    def step_host_clock(self, host: str, delta_ns: int) -> None:
        """Fault injection: the host's clock jumps (an NTP step)."""
        with self._lock:
            self._advance()
            self._clocks[host].step_ns += int(delta_ns)
            self._truth.append(self._now(), "clock_step", host, "", 0)
        for observer in self.on_clock_step:
            observer(host)

    def set_admin(self, host: str, netdev: str, up: bool) -> None:
        """`ip link set dev NETDEV down|up`. Down: the transmitter goes dark (mlx5 sets the port's admin status
        down; ethtool's power-mode-policy `auto` puts a paged module in low power, data path off) and the link
        drops at once (Disabled). Up: the laser returns, and a receiver that sees light trains again (its own
        draws)."""
        with self._lock:
            self._advance()
            port = self._port(host, netdev)
            if port.state.admin_up == up:
                return
            t = self._now()
            self._admin_changes += 1
            command = self._admin_changes
            (self._lit_ingress.add if up else self._lit_ingress.discard)(port.model.ocs_tx)
            self._truth.append(t, "admin_up" if up else "admin_down", host, netdev, port.model.ocs_tx)
            if up:
                self._nic.emit(port, t, None, admin_up=True, phys_state="Polling")
                if port.model.ocs_rx in self._lit_egress:
                    self._nic.light_changed(port, t, True, command, _ADMIN)
            else:
                port.gen += 1  # a training in flight stops here
                had_carrier = port.state.carrier
                self._nic.emit(port, t, "port_down" if had_carrier or port.state.ib_state != "DOWN" else None,
                           admin_up=False, carrier=False, phys_state="Disabled", ib_state="DOWN", operstate="down",
                           carrier_down_count=port.state.carrier_down_count + int(had_carrier))
                self._update_data_plane(t, (port,))
            egress = self._settled.get(port.model.ocs_tx)
            if egress is not None:
                self._set_light(t, egress, command, _ADMIN)  # the receiver it lit goes dark, or lights again

    def set_port_fault(self, host: str, netdev: str, fault: str | None, *, flaps: int = 3,
                       flap_ms: float = 1.0) -> None:
        """Fault injection, from the next light-on: "never_up" keeps the PHY from training after CDR lock;
        "flap" drops and retrains the carrier `flaps` times (each phase `flap_ms`) before the port goes
        ACTIVE, while the light stays on."""
        if fault not in (None, "never_up", "flap"):
            raise ValueError(f"unknown port fault {fault!r}")
        if fault == "flap" and (flaps < 1 or flap_ms <= 0):
            raise ValueError("a flap needs flaps >= 1 and flap_ms > 0")
        with self._lock:
            self._advance()
            port = self._port(host, netdev)
            port.fault, port.flaps, port.flap_ns = fault, int(flaps), int(flap_ms * 1e6)

    def subscribe(self, host: str, callback: Callable[[NicChange], None]) -> Callable[[], None]:
        with self._lock:  # not between a batch of changes and the subscribers it goes to
            return self._subs.add(host, callback)

    def ground_truth(self) -> list[dict]:
        with self._lock:
            self._advance()
            return self._truth.rows()

    def ground_truth_columns(self, stages=None):
        """`ground_truth()` as columns (devices.emulated.truth.TruthLog.columns), only `stages` if given."""
        with self._lock:
            self._advance()
            return self._truth.columns(stages)

    def ground_truth_frame(self, stages=None):
        """`ground_truth()` as a DataFrame (devices.emulated.truth.TRUTH_COLUMNS), only `stages` if given."""
        with self._lock:
            self._advance()
            return self._truth.frame(stages)

    def draws(self) -> list[dict]:
        """Every random delay drawn: command, port ("ocs" or host:netdev), stage, delay_ns, late_ns — how
        long after its due time the action it timed actually ran (0 until it ran) — and due_ns, that due time on
        the harness clock (-1 until it ran)."""
        return self.draws_frame().to_dict(orient="records")

    def draws_frame(self, start: int = 0, stop: int | None = None):
        """`draws()` as a DataFrame, built from the columns (strings shared per distinct value); only the draws
        [start, stop) if given."""
        import pandas as pd

        names = np.empty(len(self._ports) + 1, dtype=object)
        names[:] = [p.model.key for p in self._ports.values()] + ["ocs"]  # index -1: the switch
        stages = np.empty(len(_STREAM_STAGES), dtype=object)
        stages[:] = list(_STREAM_STAGES)
        with self._lock:
            stop = len(self._draws["command"]) if stop is None else stop
            cols = {k: v.numpy(start, stop) for k, v in self._draws.items()}
        return pd.DataFrame({"command": cols["command"].astype(np.int64), "port": names[cols["port"]],
                             "stage": stages[cols["stage"]], "delay_ns": cols["delay_ns"].astype(np.int64),
                             "late_ns": cols["late_ns"].astype(np.int64), "due_ns": cols["due_ns"].astype(np.int64)},
                            columns=["command", "port", "stage", "delay_ns", "late_ns", "due_ns"])

    def draw_count(self) -> int:
        with self._lock:
            return len(self._draws["command"])

    def _draw_columns(self, names: tuple[str, ...], rows: int = DRAW_BLOCK):
        """The draws' columns `names` as numpy arrays, a block of `rows` draws at a time (a campaign draws ~10^7)."""
        n = self.draw_count()
        for start in range(0, n, rows):
            with self._lock:
                yield [self._draws[k].numpy(start, min(n, start + rows)) for k in names]

    def schedule_report(self) -> dict:
        """Lateness of the schedule and, per stage, the delays realised against the profile's
        (analysis.accuracy.realised_vs_profile), with a warning line when the machine made it late. One stage's
        draws in memory at a time, read a block at a time."""
        from analysis.accuracy import stage_vs_profile, stages_vs_profile

        order: dict[int, None] = {}  # the stages in the order first drawn
        for (stage,) in self._draw_columns(("stage",)):
            codes, first = np.unique(stage, return_index=True)
            order.update(dict.fromkeys(codes[np.argsort(first)].tolist()))
        ports = [p.model.key for p in self._ports.values()]
        rows = {}
        for code in order:
            name = _STREAM_STAGES[code]
            delay, late, u = [], [], []
            for stage, port, d, lt in self._draw_columns(("stage", "port", "delay_ns", "late_ns")):
                mine = stage == code
                port, d, lt = port[mine], d[mine], lt[mine]
                realised = (d + lt).astype(float) / 1e9
                uu = np.full(len(d), np.nan)
                for index in np.unique(port).tolist():
                    model = self.profile.ocs[name] if index == -1 else self.profile.nic_delay(ports[index], name)
                    at = port == index
                    cdf = model.cdf(realised[at])
                    if cdf is not None:
                        uu[at] = cdf
                delay.append(d)
                late.append(lt)
                u.append(uu)
            rows[name] = stage_vs_profile(np.concatenate(delay), np.concatenate(late), np.concatenate(u))
        return {"lateness_ms": self.lateness(), **stages_vs_profile(rows)}

    def lateness(self) -> dict:
        """How late actions ran against their due time: n, p50, p99 and max in ms."""
        with self._lock:
            late = self._schedule.late_ns.numpy()  # int64: a float copy of ~10^7 values is not needed
        return Schedule.summary(late)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until no transition is scheduled (for tests)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                self._advance()
                if self._schedule.next_due() is None and (not self._nic.pending or self._thread is None):
                    return True
            time.sleep(0.001)
        return False
