"""The physical truth of the emulated bench, composed in `OpticalBench`: the switch's mirrors
(devices/emulated/switching.py), the fibres from them to the NIC ports and the ports' state machines
(devices/emulated/nic.py), the data-plane probes (devices/emulated/probes.py), the hosts' clocks, the seeded delays
they all draw (devices/emulated/draws.py) and the schedule they run on (devices/emulated/schedule.py).

Protocol servers (TL1/SCPI/NETCONF, SSH hosts) are thin views over one `OpticalBench`. State changes are actions
on the schedule, each run with its DUE time: a late scheduler thread (a busy machine) cannot reorder cause and
effect or stretch the profile's delays. Every reader (snapshots, port power, ground truth, the next command)
first runs whatever is due, so the state it sees is the state at "now" on the schedule. Late running is recorded
(`lateness()`, `schedule_report()`). Ground truth is appended with due times on the harness clock (CLOCK_MONOTONIC).

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

from devices.emulated.draws import ADMIN, CLOCK, STREAM_STAGES, DrawLog, KeyedStreams
from devices.emulated.nic import CMIS_RESET, NicChange, NicModel, NicSnapshot, NicStateMachine, Port, Subscribers
from devices.emulated.probes import ProbePaths
from devices.emulated.profile import Profile
from devices.emulated.schedule import Schedule
from devices.emulated.switching import MirrorSwitch
from devices.emulated.truth import TruthLog
from devices.timing import now_ns

DRAW_BLOCK = 1 << 17  # draws read at once when reporting on them or writing them (a block as a frame: ~15 MB)


@dataclass
class HostClock:
    """A host's clock (the physics' and a worker's view of it, devices/emulated/shards.py): CLOCK_MONOTONIC plus
    the wall epoch, a seeded offset and drift, and the steps injected since."""

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
        self._draws = DrawLog(self._streams)
        self._now = clock  # CLOCK_MONOTONIC ns; tests pass a fake clock to make the scheduler late at will
        topo = profile.topology
        self.ocs_size = topo.ocs_size
        n_in = topo.ocs_size[0]
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._schedule = Schedule(clock, self._wake, self._draws.late_ns, self._draws.due_ns)
        self._truth = TruthLog()
        self._switch = MirrorSwitch(self.ocs_size, profile.ocs, schedule=self._schedule, truth=self._truth,
                                    draw=self._draw, light=self._egress_light)
        self._nic = NicStateMachine(
            profile, at=self._schedule.at, draw=self._draw, truth=self._truth,
            far_end=lambda port: self._switch.source_of(port.model.ocs_rx),
            peer_of=lambda port: self._probes.peer_of(port),
            link_changed=lambda t, port: self._probes.update(t, self._probes.affected(port)))
        self._subs = Subscribers()
        # Observers of mirror moves (MirrorSwitch.on_mirror): quick, and never calling back into the bench;
        # `unwatch_mirror` removes one.
        self.on_mirror = self._switch.on_mirror
        self.on_clock_step: list[Callable[[str], None]] = []  # called (host) after a clock step, no lock held
        self._thread: threading.Thread | None = None
        self._stop = False
        self.hosts = [f"{host_prefix}{h + 1}" for h in range(topo.hosts)]
        self._ports: dict[tuple[str, str], Port] = {}
        epoch = time.time_ns() - time.monotonic_ns()
        start = self._now()
        lo, hi = profile.clock_offset_ms
        dlo, dhi = profile.drift_ppm
        draw = lambda stage, h: self._streams.uniform(CLOCK, 0, stage, h, len(self.hosts))  # noqa: E731
        self._clocks = {h: HostClock(epoch, int((lo + (hi - lo) * draw("clock_offset", i)) * 1e6),
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
        self._probes = ProbePaths(self._switch, self._ports.values(), at=self._schedule.at, truth=self._truth,
                                  nic=self._nic)
        for ingress in self._probes.by_tx:  # every NIC laser is on
            self._switch.transmit(ingress, True)
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
        return self._draws.draw(domain, command, stage, delay, -1 if port is None else port.index, len(self._ports))

    # ------------------------------------------------------------------ OCS view
    def ocs_patches(self) -> dict[int, int]:
        with self._lock:
            self._advance()
            return self._switch.patches()

    def ocs_apply(self, adds: dict[int, int], removes: Iterable[int] = (), at_ns: int | None = None,
                  switch: int = 0) -> int:
        """Validate, then move mirrors (refused with switching.OcsRefusal). Returns the monotonic ns when every
        moved mirror has settled.

        `switch`: which switch over this physics sent it (devices.emulated.bench.SwitchSlice); its commands are
        counted on their own, the first switch's keyed exactly as a lone switch's.

        `at_ns`: when the command reached the switch (a server's kernel receive stamp). The mirrors move from
        then, not from when a busy machine let the server's thread get to it — as far back as no reader has
        seen the state since (every change it makes falls after the last read)."""
        removes = list(removes)
        with self._lock:
            self._advance(observed=False)
            return self._switch.apply(adds, removes, at_ns, switch)

    def ocs_port_power(self, port: int) -> float:
        with self._lock:
            self._advance()
            return self._switch.port_power(port)

    def _egress_light(self, t: int, egress: int, on: bool, changed: bool, source: int | None, command: int,
                      domain: int) -> None:
        """Egress `egress` is lit (`on`, from ingress `source`) or dark; `changed`: it was the other before."""
        port = self._probes.by_rx.get(egress)
        if port is None:
            return
        if changed or (on and self._nic.link_up(port) and port.trained_on != source):
            # a light change, or another transmitter on a link up (never dark between)
            self._nic.light_changed(port, t, on, command, domain)
        self._probes.update(t, (port,))  # its peer may have changed even where the light did not

    # ------------------------------------------------------------------ data plane (probes)
    def probe_start(self, host: str, netdev: str, interval_ns: int) -> None:
        if interval_ns <= 0:
            raise ValueError("probe interval must be > 0")
        with self._lock:
            self._advance()
            self._probes.send(self._port(host, netdev), self._now(), interval_ns)

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
            self._probes.send(self._port(host, netdev), self._now(), 0)

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
            return now, self._nic.states_at(now, self._ports.values())

    def nic_changes(self, since_ns: int) -> tuple[int, list[tuple[int, str, NicSnapshot]]]:
        """(now on the schedule, the (due ns, "host:netdev", state) changes of light, PHY and port state in
        (since_ns, now], in due order)."""
        with self._lock:
            now = self._now()
            self._advance()
            return now, self._nic.changes(since_ns, now)

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
            self._switch.transmit(port.model.ocs_tx, up)
            self._truth.append(t, "admin_up" if up else "admin_down", host, netdev, port.model.ocs_tx)
            self._nic.admin_changed(port, t, up, self._switch.lit(port.model.ocs_rx), command, ADMIN)
            if not up:
                self._probes.update(t, (port,))
            egress = self._switch.target_of(port.model.ocs_tx)
            if egress is not None:
                self._switch.set_light(t, egress, command, ADMIN)  # the receiver it lit goes dark, or lights again

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

    def unwatch_mirror(self, observer: Callable[[int, int, int, bool], None]) -> None:
        """Remove `observer` from `on_mirror` if there (under the lock the scheduler calls the observers with)."""
        with self._lock:
            if observer in self.on_mirror:
                self.on_mirror.remove(observer)

    def port_fault(self, host: str, netdev: str) -> str | None:
        """The port's injected fault (`set_port_fault`), None if none."""
        with self._lock:
            return self._port(host, netdev).fault

    def subscribe(self, host: str, callback: Callable[[NicChange], None]) -> Callable[[], None]:
        with self._lock:  # not between a batch of changes and the subscribers it goes to
            return self._subs.add(host, callback)

    def ground_truth(self) -> list[dict]:
        with self._lock:
            self._advance()
            return self._truth.rows()

    def ground_truth_columns(self, stages=None, start: int = 0, stop: int | None = None):
        """`ground_truth()` as columns (devices.emulated.truth.TruthLog.columns), only `stages` if given, of the
        rows [start, stop) if given (`truth_rows()`: how many there are)."""
        with self._lock:
            self._advance()
            return self._truth.columns(stages, start, stop)

    def truth_rows(self) -> int:
        with self._lock:
            self._advance()
            return len(self._truth)

    def ground_truth_frame(self, stages=None):
        """`ground_truth()` as a DataFrame (devices.emulated.truth.TRUTH_COLUMNS), only `stages` if given."""
        with self._lock:
            self._advance()
            return self._truth.frame(stages)

    def draws(self) -> list[dict]:
        """Every random delay drawn: command, port ("ocs" or host:netdev), stage, delay_ns, late_ns — how much
        later than drawn the bench realised it (devices.emulated.schedule: a switch that started late; on a bench
        realised in a kernel, also how late the action ran) — and due_ns, its action's due time on the harness
        clock (-1 until it ran)."""
        return self.draws_frame().to_dict(orient="records")

    def draws_frame(self, start: int = 0, stop: int | None = None):
        """`draws()` as a DataFrame, built from the columns (strings shared per distinct value); only the draws
        [start, stop) if given."""
        return self._draws.frame([p.model.key for p in self._ports.values()], self._lock, start, stop)

    def realise_when_run(self) -> None:
        """Changes are realised outside this process when their actions run (a netns data plane, sshd hosts): a
        late action then adds to its draw's realised delay (Schedule.realised_when_run)."""
        with self._lock:
            self._schedule.realised_when_run = True

    def draw_count(self) -> int:
        with self._lock:
            return len(self._draws)

    def _draw_columns(self, names: tuple[str, ...], rows: int = DRAW_BLOCK):
        """The draws' columns `names` as numpy arrays, a block of `rows` draws at a time (a campaign draws ~10^7)."""
        n = self.draw_count()
        for start in range(0, n, rows):
            with self._lock:
                yield [self._draws.columns[k].numpy(start, min(n, start + rows)) for k in names]

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
            name = STREAM_STAGES[code]
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
        return Schedule.summary(late, scratch=True)

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
