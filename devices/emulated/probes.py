"""The emulated data-plane probes: a NIC port's probe sender, and whether its probes reach the receiver its light
reaches — both ports ACTIVE and the receiver lit by it. A flow that starts getting through schedules its first
arrival (ground truth `first_packet`, a `probe_first` change pushed to the receiving host). The composition
(devices/emulated/physics.py) holds the lock and tells it which ports' paths changed."""
from __future__ import annotations

from typing import Callable, Iterable

from devices.emulated.nic import NicChange, NicStateMachine, Port
from devices.emulated.switching import MirrorSwitch
from devices.emulated.truth import TruthLog

WIRE_LATENCY_NS = 2_000  # fibre + serialisation of one probe frame


class ProbePaths:
    """Probe paths over `switch` between `ports` (each NIC's TX on an ingress, its RX on an egress). `at(due_ns,
    action)` schedules an action (devices.emulated.schedule.Schedule.at); first arrivals go to `truth` and to
    `nic.pending`. Not thread-safe: the bench holds its lock around every call."""

    def __init__(self, switch: MirrorSwitch, ports: Iterable[Port], *, at: Callable, truth: TruthLog,
                 nic: NicStateMachine):
        self._switch, self._at, self._truth, self._nic = switch, at, truth, nic
        ports = list(ports)
        self.by_rx = {p.model.ocs_rx: p for p in ports}  # the NIC whose receiver an egress lights
        self.by_tx = {p.model.ocs_tx: p for p in ports}  # the NIC whose transmitter lights an ingress

    def peer_of(self, port: Port) -> Port | None:
        """The NIC whose transmitter currently lights this port's receiver."""
        ingress = self._switch.source_of(port.model.ocs_rx)
        return None if ingress is None else self.by_tx.get(ingress)

    def _receiver_of(self, port: Port) -> Port | None:
        """The NIC whose receiver this port's transmitter currently lights."""
        egress = self._switch.target_of(port.model.ocs_tx)
        return None if egress is None else self.by_rx.get(egress)

    def affected(self, port: Port) -> tuple[Port, ...]:
        """Receivers whose probe path depends on `port`'s state: itself and the port it transmits to."""
        receiver = self._receiver_of(port)
        return (port,) if receiver is None or receiver is port else (port, receiver)

    def update(self, t: int, ports: Iterable[Port]) -> None:
        """Re-evaluate, for the given receiving ports (those whose path just changed), whether probes from
        their peer get through: O(changed ports), not O(ports²)."""
        for port in ports:
            peer = self.peer_of(port) if self._switch.lit(port.model.ocs_rx) else None
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

                self._at(arrival, first)

    def send(self, port: Port, t: int, interval_ns: int) -> None:
        """The port's probe sender runs from `t` every `interval_ns` (0: it stops)."""
        port.probe_interval_ns = int(interval_ns)
        if interval_ns:
            port.probe_t0_ns = t
        self._at(t, lambda t: self.update(t, self.affected(port)))
