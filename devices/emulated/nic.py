"""The emulated NIC ports: their state (`NicSnapshot`), the changes pushed to hosts (`NicChange`), and the state
machine a port runs through when its receiver's light changes: light detected, CDR lock, (CMIS module and data
path), PHY up, port ACTIVE; and the link drops when the light goes, the far-end transmitter changes, the port is
set down, or a fault says so. The composition (devices/emulated/physics.py) decides when the light changes, draws
the delays and runs the schedule."""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple

from devices.emulated.profile import Profile

DARK_DBM = -60.0
# the stages a transfer's rate depends on (light, PHY and port state): kept in the rate log
RATE_STAGES = frozenset({"light_lost", "light_detected", "port_down", "phy_up", "port_active"})


@dataclass(frozen=True)
class NicModel:
    host: str
    netdev: str
    rdma_dev: str
    rdma_port: int
    mac: str
    ifindex: int
    ocs_tx: int
    ocs_rx: int

    @property
    def key(self) -> str:
        return f"{self.host}:{self.netdev}"


class NicSnapshot(NamedTuple):
    """A NIC port's state at one instant (a tuple: a pod's burst makes ~10^3 in a millisecond of emulated
    time; the rate log keeps each as a plain tuple, which the garbage collector stops tracking)."""

    rx_los: bool = True
    rx_lol: bool = True
    carrier: bool = False
    phys_state: str = "Polling"
    ib_state: str = "DOWN"
    operstate: str = "down"
    carrier_up_count: int = 0
    carrier_down_count: int = 0
    link_downed: int = 0
    rx_power_dbm: float = DARK_DBM
    speed_mbps: int = 400_000
    light_lost_ns: int | None = None  # when the light last went off (the fabric's failure detection starts)
    admin_up: bool = True  # `ip link set dev X up|down`: a port set down transmits no light and holds no link
    lit_by: str | None = None  # the NIC ("host:netdev") whose transmitter lights this receiver, None when dark
    # CMIS module (ethtool -m "Module State") and data-path states; None: the module shows none (the default)
    module_state: str | None = None
    datapath_state: str | None = None


_SNAPSHOT_INDEX = {name: i for i, name in enumerate(NicSnapshot._fields)}
_SNAPSHOT_FIELDS = frozenset(_SNAPSHOT_INDEX)
# snapshot attribute -> the agent's watch field it shows as
_WATCHED = {"rx_los": "rx_los", "rx_lol": "rx_lol", "carrier": "carrier", "phys_state": "phys_state",
            "ib_state": "state", "operstate": "operstate", "module_state": "module_state",
            "datapath_state": "datapath_state"}
# A CMIS module that lost its light: the host re-initialises it (the SONiC CMIS manager's re-init the field reports),
# so it passes ModuleReady and DataPathActivated again before its PHY can train.
CMIS_RESET = {"module_state": "ModuleLowPwr", "datapath_state": "DataPathDeactivated"}


def _with(snapshot: NicSnapshot, changes: dict) -> NicSnapshot:
    """`snapshot` with `changes` (a pod's burst runs this hundreds of times in a millisecond of emulated
    time: one tuple built from the fields, no per-call introspection)."""
    if not changes.keys() <= _SNAPSHOT_FIELDS:
        raise TypeError(f"NicSnapshot has no field(s) {sorted(changes.keys() - _SNAPSHOT_FIELDS)}")
    values = list(snapshot)
    for name, value in changes.items():
        values[_SNAPSHOT_INDEX[name]] = value
    return tuple.__new__(NicSnapshot, values)


class NicChange(NamedTuple):
    """One watched field of one port changed at `t_ns` (a tuple: a pod's burst makes ~10^3 of them in a
    millisecond of emulated time, and a frozen dataclass's __init__ costs ~1.5 µs each)."""

    t_ns: int
    host: str
    netdev: str
    field: str
    value: str


class Subscribers:
    """Callbacks per host for the NIC changes pushed to it: the physics' own, and a worker process's view of it
    (devices/emulated/shards.py). Delivery is outside any lock (a subscriber may read snapshots)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_host: dict[str, list[Callable[[NicChange], None]]] = {}
        self._snapshot: dict[str, tuple[Callable[[NicChange], None], ...]] | None = None

    def add(self, host: str, callback: Callable[[NicChange], None]) -> Callable[[], None]:
        """Subscribe; returns the unsubscribe."""
        with self._lock:
            self._by_host.setdefault(host, []).append(callback)
            self._snapshot = None

        def remove():
            with self._lock:
                if callback in self._by_host.get(host, []):
                    self._by_host[host].remove(callback)
                    self._snapshot = None

        return remove

    def snapshot(self) -> dict[str, tuple[Callable[[NicChange], None], ...]]:
        """The subscribers now (read-only; built again only after a change: the scheduler takes one per pass)."""
        with self._lock:
            if self._snapshot is None:
                self._snapshot = {h: tuple(cbs) for h, cbs in self._by_host.items()}
            return self._snapshot

    @staticmethod
    def deliver(changes: Iterable[NicChange], subs: dict[str, list[Callable[[NicChange], None]]]) -> None:
        for change in changes:
            for callback in subs.get(change.host, ()):
                callback(change)


@dataclass
class Port:
    model: NicModel
    index: int = 0  # position in the bench: the port part of its stream key
    state: NicSnapshot = field(default_factory=NicSnapshot)
    gen: int = 0  # bumped on every light change; stale scheduled transitions check it
    probe_interval_ns: int = 0
    probe_t0_ns: int = 0
    dp_gen: int = 0  # data-plane generation for first-packet scheduling
    dp_up: bool = False
    dp_flow: tuple[str, int, int, int] | None = None  # while up: (sender MAC, first seq, its arrival ns, interval)
    fault: str | None = None  # "never_up" | "flap" | None
    flaps: int = 0  # "flap": carrier down/up cycles after each PHY training, light staying on
    flap_ns: int = 1_000_000  # "flap": how long each carrier-down and carrier-up phase lasts
    trained_on: int | None = None  # the ingress whose signal the link last trained on (its far-end transmitter)
    cmis: bool = False  # its module shows CMIS module / data-path states (the profile gives their delays)


class NicStateMachine:
    """Every port's transitions. What it needs of the bench it is part of:

    - `at(due_ns, action, draw)`: schedule an action (devices.emulated.schedule.Schedule.at);
    - `draw(domain, command, stage, delay, port)`: (delay ns, draw index) of a profile delay for this port;
    - `far_end(port)`: the ingress whose settled mirror points at the port's receiver, None if none;
    - `peer_of(port)`: the NIC port transmitting into that ingress, None if none;
    - `link_changed(t, port)`: the port's link went up or down (the data plane re-evaluates its probe paths);
    - `truth`: the ground truth (devices.emulated.truth.TruthLog) it appends each stage to.

    Its outputs: `pending` (changes not yet pushed to the hosts' subscribers; the owner takes them) and
    `rate_log` ((due ns, "host:netdev", state after) of each change a transfer's rate depends on: the emulated
    tools integrate their bytes over it, devices/emulated/dataplane.py)."""

    def __init__(self, profile: Profile, *, at, draw, far_end, peer_of, link_changed, truth):
        self.profile = profile
        self._at, self._draw, self._far_end, self._peer_of = at, draw, far_end, peer_of
        self._link_changed, self._truth = link_changed, truth
        self.pending: list[NicChange] = []
        # The state as a plain tuple of atomic values, and the key a str: the garbage collector untracks such
        # tuples (exact tuples only, not NicSnapshot's). Tracked, a pod's ~6.5 * 10^4 entries were walked by
        # every full collection: ~0.13 s with the emulator's GIL held, every few dozen cycles.
        self.rate_log: deque = deque(maxlen=1 << 16)

    @staticmethod
    def link_up(port: Port) -> bool:
        return port.state.carrier or port.state.ib_state != "DOWN"

    def drop_link(self, port: Port, t: int, **changes) -> None:
        had_carrier = port.state.carrier
        self.emit(port, t, "port_down", carrier=False, phys_state="Polling", ib_state="DOWN", operstate="down",
                  carrier_down_count=port.state.carrier_down_count + int(had_carrier),
                  link_downed=(port.state.link_downed + int(had_carrier)) % 256, **changes)
        self._link_changed(t, port)

    def emit(self, port: Port, t: int, stage: str | None, **changes) -> None:
        """Apply `changes` to the port's state at `t`: push the watched fields that changed, and record `stage`
        (if any) as ground truth."""
        old = port.state
        port.state = _with(old, changes)
        model = port.model
        for attr, value in changes.items():
            name = _WATCHED.get(attr)
            if name is not None and old[_SNAPSHOT_INDEX[attr]] != value:
                value = str(int(value)) if isinstance(value, bool) else str(value)
                self.pending.append(NicChange(t, model.host, model.netdev, name, value))
        if stage:
            self._truth.append(t, stage, port.model.host, port.model.netdev, port.model.ocs_rx)
            if stage in RATE_STAGES:
                self.rate_log.append((t, port.model.key, tuple(port.state)))

    def admin_changed(self, port: Port, t: int, up: bool, lit: bool, command: int, domain: int) -> None:
        """`ip link set` changed the port's admin state at `t` (`lit`: its receiver sees light; `command` and
        `domain` key the draws). Down: the link drops at once (Disabled); up: it trains again if lit."""
        if up:
            self.emit(port, t, None, admin_up=True, phys_state="Polling")
            if lit:
                self.light_changed(port, t, True, command, domain)
        else:
            port.gen += 1  # a training in flight stops here
            had_carrier = port.state.carrier
            self.emit(port, t, "port_down" if had_carrier or port.state.ib_state != "DOWN" else None,
                      admin_up=False, carrier=False, phys_state="Disabled", ib_state="DOWN", operstate="down",
                      carrier_down_count=port.state.carrier_down_count + int(had_carrier))

    def states_at(self, now: int, ports: Iterable[Port]) -> dict[str, NicSnapshot]:
        """{"host:netdev": state at `now`} of `ports`, whose states may have run past `now` (the rate log tells
        their last state by then)."""
        states = {p.model.key: p.state for p in ports}
        later: set[str] = set()  # ports whose state moved past `now`: their last state by `now` instead
        for t, key, state in reversed(self.rate_log):  # due order
            if t > now:
                later.add(key)
            elif not later:
                break
            elif key in later:
                states[key] = NicSnapshot._make(state)
                later.discard(key)
        return states

    def changes(self, since_ns: int, now: int) -> list[tuple[int, str, NicSnapshot]]:
        """The rate log's (due ns, "host:netdev", state) in (since_ns, now], in due order."""
        out = []
        for t, key, state in reversed(self.rate_log):
            if t <= since_ns:
                break
            if t <= now:
                out.append((t, key, NicSnapshot._make(state)))
        return out[::-1]

    def light_changed(self, port: Port, t: int, on: bool, command: int, domain: int) -> None:
        """The port's receiver saw its light come (`on`) or go at `t`; `command` and `domain` key the draws."""
        port.gen += 1
        gen = port.gen

        def after(t, stage, action):
            delay, draw = self._draw(domain, command, stage, self.profile.nic_delay(port.model.key, stage), port)
            self._at(t + delay, action, draw)

        if on:
            power = -3.0 - 0.05 * (port.model.ocs_rx % 7)
            if self.link_up(port) and port.trained_on != self._far_end(port):
                # A new far-end transmitter (an atomic swap, no dark gap the link could notice): its clock
                # and phase are not the ones the receiver locked to, so the lock and the link are lost now.
                self.drop_link(port, t, rx_lol=True, **(CMIS_RESET if port.cmis else {}))

            def los_clear(t, gen=gen):
                if port.gen != gen:
                    return
                peer = self._peer_of(port)
                self.emit(port, t, "light_detected", rx_los=False, rx_power_dbm=power,
                          lit_by=None if peer is None else peer.model.key)
                after(t, "cdr_lock", cdr_lock)

            def cdr_lock(t, gen=gen):
                if port.gen != gen:
                    return
                self.emit(port, t, "cdr_locked", rx_lol=False)
                if port.fault != "never_up" and port.state.admin_up:
                    if port.cmis:
                        after(t, "module_ready", module_ready)
                    else:
                        after(t, "phy_up", phy_up)

            def module_ready(t, gen=gen):
                if port.gen == gen:
                    self.emit(port, t, "module_ready", module_state="ModuleReady")
                    after(t, "datapath_activated", datapath_activated)

            def datapath_activated(t, gen=gen):
                if port.gen == gen:
                    self.emit(port, t, "datapath_activated", datapath_state="DataPathActivated")
                    after(t, "phy_up", phy_up)

            flaps_left = [port.flaps if port.fault == "flap" else 0]

            def phy_up(t, gen=gen):
                if port.gen != gen:
                    return
                port.trained_on = self._far_end(port)
                self.emit(port, t, "phy_up", carrier=True, phys_state="LinkUp",
                          carrier_up_count=port.state.carrier_up_count + 1)
                if flaps_left[0] > 0:
                    flaps_left[0] -= 1
                    self._at(t + port.flap_ns, flap_down)
                else:
                    after(t, "port_active", port_active)

            def flap_down(t, gen=gen):
                # The light stays; the PHY loses and retrains the link (a marginal transceiver).
                if port.gen != gen:
                    return
                self.emit(port, t, "port_down", carrier=False, phys_state="Polling",
                          carrier_down_count=port.state.carrier_down_count + 1,
                          link_downed=(port.state.link_downed + 1) % 256)
                self._at(t + port.flap_ns, phy_up)

            def port_active(t, gen=gen):
                if port.gen != gen:
                    return
                self.emit(port, t, "port_active", ib_state="ACTIVE", operstate="up")
                self._link_changed(t, port)

            after(t, "los_clear", los_clear)
        else:
            self.emit(port, t, "light_lost", rx_los=True, rx_lol=True, rx_power_dbm=DARK_DBM, light_lost_ns=t,
                      lit_by=None, **(CMIS_RESET if port.cmis else {}))

            def link_down(t, gen=gen):
                if port.gen == gen and self.link_up(port):
                    self.drop_link(port, t)

            after(t, "link_down", link_down)
