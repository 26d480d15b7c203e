"""The turnaround step: reconfigure, then timestamp every stage on every affected port.

Per cycle: apply the next mapping on the OCS (ocs_command_sent / ocs_command_completed on the harness
clock), then collect what the hosts' agents report — Rx LOS/LOL, carrier, port state, first probe — each
stamped on the host's clock and corrected with that host's tracked offset. The event log is fsynced
before the next cycle starts.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from devices.errors import DeviceError
from devices.timing import Deadline, now_ns
from harness.config import REQUIRED, register_step  # noqa: F401  (REQUIRED for labs copying this schema)
from harness.errors import InputError
from harness.events import Event
from harness.hostsession import Observation
from harness.patterns import cycle_mappings, ocs_mapping, sources
from harness.steps import StepResult

# (watch field, value) -> stage. rx_los/rx_lol come from `ethtool -m`, carrier from sysfs, state from the
# RDMA port; operstate stands in for state on a NIC without an RDMA device.
WATCH_STAGES = {
    ("rx_los", "0"): "light_detected",
    ("rx_los", "1"): "light_lost",
    ("rx_lol", "0"): "cdr_locked",
    ("carrier", "1"): "phy_up",
    ("carrier", "0"): "port_down",
    ("state", "ACTIVE"): "port_active",
}
UP_STAGES = ("light_detected", "cdr_locked", "phy_up", "port_active", "first_packet")

SCHEMA = {
    "cycles": (int, 0),  # 0: the playbook's (or --cycles) value
    "pattern": (str, "ring-shift"),
    "schedule": (str, ""),
    "ports": (list, []),  # NIC port keys "host:netdev"; empty: every port in the inventory
    "watch_interval_us": (int, 200),
    "ethtool_interval_us": (int, 1000),
    "probes": (bool, True),
    "probe_interval_us": (int, 100),
    "probe_gap_us": (int, 2000),
    "udp_port": (int, 4791),
    "cycle_timeout_s": (float, 60.0),
    "settle_s": (float, 0.0),
    "clock_resync_s": (float, 0.5),  # background re-estimation period per host
    "clock_warmup_s": (float, 1.5),  # clock samples to gather before cycle 1 (drift needs a span)
}


@dataclass
class _PortInfo:
    key: str
    host: str
    netdev: str
    rdma_dev: str
    ocs: str
    tx: int
    rx: int


@dataclass
class CycleOutcome:
    cycle: int
    status: str  # ok | faulted
    begin_ns: int
    sent_ns: int
    completed_ns: int
    done_ns: int
    affected: list[str]
    missing: dict[str, list[str]] = field(default_factory=dict)


def _probe_template(port: _PortInfo, index: int, udp_port: int) -> bytes:
    from devices.agent import build_probe_template

    mac = f"02:00:00:00:{index // 256:02x}:{index % 256:02x}"
    return build_probe_template(src_mac=mac, dst_mac="ff:ff:ff:ff:ff:ff", src_ip=f"198.18.{index // 250}.{index % 250 + 1}",
                                dst_ip="198.19.255.255", udp_port=udp_port, dqpn=0x100 + index)


class TurnaroundRun:
    def __init__(self, ctx, step):
        self.ctx, self.step, p = ctx, step, step.params
        self.p = p
        self.cycles = p["cycles"] or ctx.cycles
        ports = [_PortInfo(n.key, n.host, n.netdev, n.rdma_dev, n.ocs, n.ocs_tx, n.ocs_rx) for n in ctx.bench.nic_ports]
        wanted = p["ports"] or [x.key for x in ports]
        by_key = {x.key: x for x in ports}
        unknown = [k for k in wanted if k not in by_key]
        if unknown:
            raise InputError(f"step {step.name}: unknown NIC port(s) {', '.join(map(str, unknown))}; known: "
                             f"{', '.join(by_key)}", step.file, step.line)
        self.ports = [by_key[k] for k in wanted]
        if len({x.ocs for x in self.ports}) != 1:
            raise InputError(f"step {step.name}: all ports must be on one OCS", step.file, step.line)
        self.ocs = self.ports[0].ocs
        self.tx = {x.key: x.tx for x in self.ports}
        self.rx = {x.key: x.rx for x in self.ports}
        self.by_host_netdev = {(x.host, x.netdev): x for x in self.ports}
        self.by_key = {x.key: x for x in self.ports}
        self.queue: "queue.Queue[Observation]" = queue.Queue()
        self.outcomes: list[CycleOutcome] = []
        self.truth_windows: list[tuple[int, int]] = []  # (cycle, sent_ns)

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        ctx, p = self.ctx, self.p
        self.switch = ctx.switch(self.ocs)
        self.original = self.switch.patches()
        ctx.teardown.callback(self._restore)
        if ctx.dry_run:
            return
        hosts = sorted({x.host for x in self.ports})
        self.sessions = {h: ctx.session(h) for h in hosts}
        for h, s in self.sessions.items():
            specs = [(x.netdev, x.rdma_dev, 1) for x in self.ports if x.host == h]
            s.start_watch(specs, p["watch_interval_us"], p["ethtool_interval_us"], self.queue)
            if p["probes"]:
                for x in self.ports:
                    if x.host == h:
                        s.start_probe_recv(x.netdev, p["probe_gap_us"], p["udp_port"], self.queue)
                for i, x in enumerate(self.ports):
                    if x.host == h:
                        s.start_probe_send(x.netdev, _probe_template(x, i, p["udp_port"]), p["probe_interval_us"],
                                           self.queue)
            s.start_clock_sync(p["clock_resync_s"])

    def _restore(self) -> None:
        """Put back the cross-connects found at start, on the ports this step touched, and verify."""
        try:
            touched = set(self.tx.values()) | set(self.rx.values())
            wanted = {i: e for i, e in self.original.items() if i in touched or e in touched}
            self.switch.apply(wanted, exclusive=True)
            now = self.switch.patches()
            restored = all(now.get(i) == e for i, e in wanted.items()) and not any(
                i in touched and i not in wanted for i in now)
            self.ctx.manifest_extra.setdefault("restored", {})[self.ocs] = bool(restored)
        except Exception as exc:  # report, never mask the original error
            self.ctx.manifest_extra.setdefault("restored", {})[self.ocs] = False
            self.ctx.manifest_extra.setdefault("restore_error", {})[self.ocs] = str(exc)

    # ------------------------------------------------------------------ cycles
    def run(self) -> StepResult:
        ctx, p = self.ctx, self.p
        rng = ctx.rng(f"turnaround:{self.step.name}")
        self.setup()
        keys = [x.key for x in self.ports]
        current: dict[str, str] = {}
        progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[last]}"), TimeElapsedColumn(), disable=ctx.quiet,
                            transient=False)
        with progress:
            task = progress.add_task("turnaround", total=self.cycles, last="")
            resume = ctx.resume_after.get(self.step.name, 0)
            progress.update(task, completed=resume)
            plan = list(cycle_mappings(p["pattern"], keys, self.cycles, rng, p["schedule"]))
            for cycle, mapping in plan[resume:]:
                if ctx.dry_run:
                    ocs_map = ocs_mapping(mapping, self.tx, self.rx)
                    ctx.say(f"cycle {cycle}: " + ", ".join(f"{i}->{e}" for i, e in sorted(ocs_map.items())))
                    self.switch.apply(ocs_map, exclusive=True)
                    continue
                if cycle == resume:
                    # Bring the bench into the state the next measured cycle starts from; not measured.
                    self.run_cycle(cycle, mapping, current, record=False)
                    current = mapping
                    self._warm_up_clocks()
                    continue
                outcome = self.run_cycle(cycle, mapping, current)
                current = mapping
                self.outcomes.append(outcome)
                total = (max((t for t in self._last_up.values()), default=outcome.done_ns) - outcome.sent_ns) / 1e6
                progress.update(task, advance=1, last=f"{outcome.status} {total:8.1f} ms")
                if p["settle_s"] > 0:
                    threading.Event().wait(p["settle_s"])
        ok = all(o.status == "ok" for o in self.outcomes)
        data = {"cycles": [o.__dict__ for o in self.outcomes], "ports": keys, "ocs": self.ocs,
                "truth_windows": self.truth_windows}
        checks = [{"name": "all cycles completed", "ok": ok,
                   "detail": f"{sum(o.status == 'ok' for o in self.outcomes)}/{len(self.outcomes)} ok"}]
        return StepResult(ok=ok, data=data, checks=checks)

    def _event(self, cycle: int, stage: str, t_ns: int, *, host: str = "", device: str = "", port: str = "",
               ocs_port: int = 0, offset_ns: int = 0, uncertainty_ns: int = 0, source: str = "") -> Event:
        return Event(self.ctx.run_id, cycle, stage, host, device, port, int(ocs_port), int(t_ns), int(offset_ns),
                     int(uncertainty_ns), source)

    def run_cycle(self, cycle: int, mapping: dict[str, str], current: dict[str, str],
                  record: bool = True) -> CycleOutcome:
        ctx, p = self.ctx, self.p
        self._drain_stale()
        old_src, new_src = sources(current), sources(mapping)
        affected = [k for k in (x.key for x in self.ports) if new_src.get(k) != old_src.get(k)]
        begin = now_ns()
        self.truth_windows.append((cycle if record else -1, begin))
        timing = self.switch.apply(ocs_mapping(mapping, self.tx, self.rx), exclusive=True)
        need = {k: set(UP_STAGES if p["probes"] else UP_STAGES[:-1]) for k in affected}
        kept: dict[tuple[str, str], Observation] = {}
        deadline = Deadline(p["cycle_timeout_s"])
        while any(need.values()) and not deadline.expired():
            try:
                obs = self.queue.get(timeout=min(0.5, deadline.remaining() or 0.5))
            except queue.Empty:
                continue
            stage, port = self._classify(obs)
            if stage is None or port.key not in need or (port.key, stage) in kept:
                continue
            t_ns, _, unc = self.sessions[obs.host].to_harness(obs.host_ns - obs.interval_ns // 2)
            if t_ns + unc + obs.interval_ns < timing.sent_ns:
                continue  # happened before this cycle's command
            kept[(port.key, stage)] = obs
            need[port.key].discard(stage)
        done = now_ns()
        # Convert only now: the clock model has samples closer to (often after) every observation.
        events = [
            self._event(cycle, "ocs_command_sent", timing.sent_ns, device=self.ocs, source="harness"),
            self._event(cycle, "ocs_command_completed", timing.completed_ns, device=self.ocs, source="harness"),
        ]
        self._last_up = {}
        for (key, stage), obs in kept.items():
            events.append(self._observed_event(cycle, stage, obs))
            if stage in UP_STAGES:
                self._last_up[key] = max(self._last_up.get(key, 0), events[-1].t_ns)
        missing = {k: sorted(v) for k, v in need.items() if v}
        for key, stages in missing.items():
            x = self.by_key[key]
            events.append(self._event(cycle, "fault", done, host=x.host, device=x.rdma_dev, port=x.netdev,
                                      ocs_port=x.rx, source=f"timeout:missing {'+'.join(stages)}"))
        if record:
            ctx.record(events)
            ctx.log.flush()  # durable before the next cycle starts
        return CycleOutcome(cycle, "faulted" if missing else "ok", begin, timing.sent_ns, timing.completed_ns,
                            done, affected, missing)

    def _warm_up_clocks(self) -> None:
        """Drift is only known over a span of samples: make sure the first measured cycle has one."""
        first = min(s.clock.segments[-1].first_t for s in self.sessions.values())
        wait = self.p["clock_warmup_s"] - (now_ns() - first) / 1e9
        if wait > 0:
            threading.Event().wait(wait)

    def _drain_stale(self) -> None:
        while True:
            try:
                obs = self.queue.get_nowait()
            except queue.Empty:
                return
            if obs.kind == "fault":
                raise DeviceError(f"{obs.host}: {obs.field}: {obs.value}")

    def _classify(self, obs: Observation) -> tuple[str | None, _PortInfo | None]:
        if obs.kind == "fault":
            raise DeviceError(f"{obs.host}: {obs.field}: {obs.value}")
        port = self.by_host_netdev.get((obs.host, obs.netdev))
        if port is None:
            return None, None
        if obs.kind == "probe":
            return ("first_packet" if obs.field == "first" else None), port
        return WATCH_STAGES.get((obs.field, obs.value)), port

    def _observed_event(self, cycle: int, stage: str, obs: Observation) -> Event:
        port = self.by_host_netdev[(obs.host, obs.netdev)]
        # A polled change happened within (host_ns - interval, host_ns]: take the midpoint.
        t_ns, offset_ns, clock_unc = self.sessions[obs.host].to_harness(obs.host_ns - obs.interval_ns // 2)
        unc = clock_unc + (obs.interval_ns + 1) // 2 + 1_000  # + 1 µs reading granularity
        source = (f"agent-probe:{obs.value.split()[0]}" if obs.kind == "probe" else f"agent-watch:{obs.field}")
        return self._event(cycle, stage, t_ns, host=port.host, device=port.rdma_dev, port=port.netdev,
                           ocs_port=port.rx, offset_ns=offset_ns, uncertainty_ns=unc, source=source)


@register_step("turnaround", SCHEMA)
def turnaround(ctx, step) -> StepResult:
    result = TurnaroundRun(ctx, step).run()
    ctx.manifest_extra.setdefault("turnaround_steps", []).append(step.name)
    return result
