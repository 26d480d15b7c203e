"""The turnaround step: reconfigure, then timestamp every stage on every affected port.

Per cycle: apply the next mapping on the OCS (ocs_command_sent / ocs_command_completed on the harness
clock), then collect what the hosts' agents report — Rx LOS/LOL, carrier, port state, first probe — each
stamped on the host's clock and corrected with that host's tracked offset. The event log is fsynced
before the next cycle starts.

Faults: a denied, silent or garbled OCS command is retried (reconnecting after a timeout) with backoff; a
dropped host connection is re-established and its streams restarted. Either labels the cycle `faulted`
with a `fault` event naming the cause. When retries run out the bench is latched broken
(`ctx.broken`): the step stops cleanly and the rest of the run is skipped. `faults:` injects faults on
the emulated bench (devices/emulated/faults.py; docs/faults.md).
"""
from __future__ import annotations

import json
import queue
import re
import shlex
import threading
import time
from dataclasses import dataclass

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from devices.errors import DeviceDenied, DeviceError, DeviceTimeout, PortNotAllowed, TransportClosed
from devices.timing import Deadline, now_ns
from harness.config import REQUIRED, register_step  # noqa: F401  (REQUIRED for labs copying this schema)
from harness.errors import InputError
from harness.events import Event
from harness.hostsession import HostSession, Observation
from harness.patterns import cycle_mappings, ocs_mapping, sources
from harness.steps import CycleOutcome, StepOutcome, resume_after_logged

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
    "clock_check_probes": (int, 1),  # clock probes per host after each cycle (catches steps); 0: off
    "ocs_timeout_s": (float, 10.0),  # deadline of one OCS command
    "retries": (int, 3),  # OCS command retries, and host reconnects per drop, before the bench is latched
    "retry_backoff_s": (float, 0.1),  # first backoff; doubles per retry
    "teardown_s": (float, 15.0),  # the restore at the end of the run must finish within this
    "faults": (list, []),  # emulated bench only: [{kind, cycles: [..] | probability: p, ...}]
}
# Watch fields whose (current) value shows that a stage has been reached.
REACHED = {"light_detected": ("rx_los", "0"), "cdr_locked": ("rx_lol", "0"), "phy_up": ("carrier", "1"),
           "port_active": ("state", "ACTIVE")}


class BenchBroken(DeviceError):
    """An unrecoverable fault: the bench is latched broken and what depends on it is skipped. `causes`:
    the transient faults met on the way (each retry)."""

    def __init__(self, message: str, causes: list[str] | None = None):
        super().__init__(message)
        self.causes = list(causes or [])


@dataclass
class _PortInfo:
    key: str
    host: str
    netdev: str
    rdma_dev: str
    rdma_port: int
    ocs: str
    tx: int
    rx: int


_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def _probe_template(mac: str, index: int, udp_port: int) -> bytes:
    from devices.agent import build_probe_template

    return build_probe_template(src_mac=mac, dst_mac="ff:ff:ff:ff:ff:ff", src_ip=f"198.18.{index // 250}.{index % 250 + 1}",
                                dst_ip="198.19.255.255", udp_port=udp_port, dqpn=0x100 + index)


def _port_mac(session, port: _PortInfo, index: int) -> str:
    """The NIC's own MAC (probes carry it, so a receiver can tell its new peer's frames from stale ones);
    a locally administered stand-in when the host does not say."""
    try:
        mac = session.transport.run(f"cat /sys/class/net/{shlex.quote(port.netdev)}/address",
                                    deadline=Deadline(5)).stdout.strip().lower()
    except DeviceError:
        mac = ""
    return mac if _MAC.match(mac) else f"02:00:00:00:{index // 256:02x}:{index % 256:02x}"


class TurnaroundRun:
    def __init__(self, ctx, step):
        self.ctx, self.step, p = ctx, step, step.params
        self.p = p
        self.cycles = p["cycles"] or ctx.cycles
        ports = [_PortInfo(n.key, n.host, n.netdev, n.rdma_dev, n.rdma_port, n.ocs, n.ocs_tx, n.ocs_rx) for n in ctx.bench.nic_ports]
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
        self.skipped: list[int] = []  # cycles not run because the bench was latched broken
        self.switch_suspect = False  # the OCS session timed out or dropped: reconnect before use
        self.reconnected: dict[str, int] = {}  # host -> harness time of its last reconnect
        self.injector = None
        self.fault_plan: dict = {}
        self.mac_of: dict[str, str] = {}  # port key -> MAC its probes carry

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        ctx, p = self.ctx, self.p
        self.switch = ctx.switch(self.ocs)
        self.switch.timeout_s = p["ocs_timeout_s"]
        self.original = self._snapshot()
        ctx.teardown.callback(self._restore)
        if ctx.dry_run:
            return
        hosts = sorted({x.host for x in self.ports})
        self.sessions = {h: ctx.session(h) for h in hosts}
        for h, s in self.sessions.items():
            specs = [(x.netdev, x.rdma_dev, x.rdma_port) for x in self.ports if x.host == h]
            s.start_watch(specs, p["watch_interval_us"], p["ethtool_interval_us"], self.queue)
            if p["probes"]:
                for x in self.ports:
                    if x.host == h:
                        s.start_probe_recv(x.netdev, p["probe_gap_us"], p["udp_port"], self.queue)
                for i, x in enumerate(self.ports):
                    if x.host == h:
                        self.mac_of[x.key] = _port_mac(s, x, i)
                        s.start_probe_send(x.netdev, _probe_template(self.mac_of[x.key], i, p["udp_port"]),
                                           p["probe_interval_us"], self.queue)
            s.start_clock_sync(p["clock_resync_s"])

    def _snapshot(self) -> dict[int, int]:
        """The cross-connects to restore: found at start, or — when resuming — those the interrupted run
        found at its start (kept in the run directory, since the switch now shows that run's last cycle)."""
        path = self.ctx.run_dir / "restore.json"
        key = f"{self.step.name}:{self.ocs}"
        saved = json.loads(path.read_text()) if path.exists() else {}
        if key in saved and self.ctx.resume_after:
            return {int(i): int(e) for i, e in saved[key].items()}
        original = self.switch.patches()
        if not self.ctx.dry_run:
            from harness.record import write_text_atomic

            saved[key] = {str(i): e for i, e in sorted(original.items())}
            write_text_atomic(path, json.dumps(saved, indent=1) + "\n")
        return original

    def _restore(self) -> None:
        """Put back the cross-connects found at start, on the ports this step touched, and verify with
        `patches()` — within `teardown_s`, whatever state the switch session is in."""
        outcome: dict[str, object] = {}

        def work():
            touched = set(self.tx.values()) | set(self.rx.values())
            wanted = {i: e for i, e in self.original.items() if i in touched or e in touched}
            try:
                if self.switch_suspect:
                    self.switch.reconnect()
                self._apply_retrying(wanted, Deadline(self.p["teardown_s"]))
            except Exception as exc:  # report, never mask the original error
                outcome["error"] = str(exc)
            try:  # verify what the switch reports, whether or not the apply went through
                now = self.switch.patches()
                outcome["restored"] = all(now.get(i) == e for i, e in wanted.items()) and not any(
                    (i in touched or e in touched) and now.get(i) != wanted.get(i) for i, e in now.items())
                if outcome["restored"]:
                    outcome.pop("error", None)
            except Exception as exc:
                outcome.setdefault("error", str(exc))

        worker = threading.Thread(target=work, daemon=True, name="restore")
        worker.start()
        deadline = Deadline(self.p["teardown_s"])
        while worker.is_alive() and not deadline.expired():
            try:
                worker.join(min(0.1, deadline.remaining() or 0.1))
            except (KeyboardInterrupt, Exception):  # another signal: the restore is bounded, let it finish
                outcome["interrupted"] = True
        if worker.is_alive():
            outcome.setdefault("error", f"restore did not finish within {self.p['teardown_s']} s")
        self.ctx.manifest_extra.setdefault("restored", {})[self.ocs] = bool(outcome.get("restored", False))
        if "error" in outcome:
            self.ctx.manifest_extra.setdefault("restore_error", {})[self.ocs] = outcome["error"]

    # ------------------------------------------------------------------ faults and retries
    def _apply_retrying(self, mapping: dict[int, int], deadline: Deadline | None = None):
        """`switch.apply` with bounded retries and exponential backoff for transient faults (DENY with a
        retryable code, timeout, dropped connection); reconnects after a timeout or a drop. `apply`
        reconciles from `patches()`, so a retry after a lost reply does not repeat the change.
        Returns (timing, first_sent_ns, causes); raises BenchBroken when the retries run out."""
        p = self.p
        causes: list[str] = []
        first_sent = None
        for attempt in range(p["retries"] + 1):
            if attempt:
                wait = p["retry_backoff_s"] * 2 ** (attempt - 1)
                if deadline is not None and (deadline.remaining() or 0) < wait:
                    break
                time.sleep(wait)
            first_sent = first_sent or now_ns()
            try:
                if self.switch_suspect:
                    self.switch.reconnect()
                    self.switch_suspect = False
                return self.switch.apply(mapping, exclusive=True), first_sent, causes
            except PortNotAllowed:
                raise
            except DeviceDenied as exc:
                if exc.permanent:
                    raise BenchBroken(f"ocs {self.ocs}: {exc}", causes) from exc
                causes.append(f"ocs-retry:{self.ocs}: denied {exc.code}")
            except (DeviceTimeout, TransportClosed) as exc:
                self.switch_suspect = True
                causes.append(f"ocs-retry:{self.ocs}: {'timeout' if isinstance(exc, DeviceTimeout) else 'connection lost'}")
            except DeviceError as exc:  # e.g. a garbled reply that parsed as something else
                self.switch_suspect = True
                causes.append(f"ocs-retry:{self.ocs}: {str(exc)[:120]}")
        raise BenchBroken(f"ocs {self.ocs}: gave up after {len(causes)} attempts "
                          f"({causes[-1] if causes else 'no time left'})", causes)

    def _host_fault(self, obs: Observation, reconnected: dict[str, int]) -> str | None:
        """A host's stream ended or sent nonsense: reconnect it once per drop. Returns the fault source
        to record, or None for a stale report of a drop already handled."""
        host = obs.host
        if obs.recv_ns and obs.recv_ns <= reconnected.get(host, 0):
            return None  # another stream reporting the same drop
        session = self.sessions[host]
        cause = f"host:{host}: {obs.field}: {obs.value}"[:300]
        if obs.field == "agent_output":
            return cause  # one unparsable line: the stream itself is alive
        last = ""
        for attempt in range(self.p["retries"] + 1):
            if attempt:
                time.sleep(self.p["retry_backoff_s"] * 2 ** (attempt - 1))
            try:
                session.reconnect(Deadline(15))
                reconnected[host] = now_ns()
                return cause
            except DeviceError as exc:
                last = str(exc)[:200]
        raise BenchBroken(f"host {host}: cannot reconnect after {self.p['retries'] + 1} attempts ({last})")

    def _plan_faults(self, rng) -> dict:
        p, step = self.p, self.step
        entries = list(p["faults"])
        profile = getattr(getattr(self.ctx.emulated, "profile", None), "faults", None) or {}
        entries += list(profile.get("inject") or [])
        if not entries:
            return {}
        if self.ctx.emulated is None:
            raise InputError(f"step {step.name}: faults: can only be injected on an emulated bench",
                             *_where(p["faults"], step))
        from devices.emulated.faults import FaultSpecError, plan_faults

        try:
            return plan_faults(entries, self.cycles, rng)
        except FaultSpecError as exc:
            if exc.index >= len(p["faults"]):  # from the profile's `faults: {inject: [...]}`
                raise InputError(f"profile faults.inject[{exc.index - len(p['faults'])}]: "
                                 f"{str(exc).split(': ', 1)[-1]}", self.ctx.emulated.profile.path) from None
            node = p["faults"][exc.index] if exc.index >= 0 else p["faults"]
            raise InputError(f"step {step.name}: {exc}", *_where(node, step, exc.key)) from None

    # ------------------------------------------------------------------ cycles
    def run(self) -> StepResult:
        ctx, p = self.ctx, self.p
        rng = ctx.rng(f"turnaround:{self.step.name}")
        self.fault_plan = self._plan_faults(ctx.rng(f"faults:{self.step.name}"))
        if getattr(ctx, "broken", None):
            return StepOutcome.skipped(ctx.broken)
        self.setup()
        self.injector = None
        if self.fault_plan and not ctx.dry_run:
            from devices.emulated.faults import FaultInjector

            self.injector = FaultInjector(ctx.emulated, [x.key for x in self.ports],
                                          ctx.rng(f"fault-targets:{self.step.name}"))
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
                lease = getattr(ctx, "lease", None)
                if lease is not None and lease.lost and not ctx.broken:
                    ctx.broken = f"bench lock lost: {lease.lost}"
                if getattr(ctx, "broken", None):
                    self.skipped.append(cycle)
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
        ok = all(o.status == "ok" for o in self.outcomes) and not self.skipped
        data = {"ports": keys, "ocs": self.ocs, "skipped_cycles": self.skipped,
                "faults_injected": self.injector.fired if self.injector else []}
        checks = [{"name": "all cycles completed", "ok": ok,
                   "detail": f"{sum(o.status == 'ok' for o in self.outcomes)}/{len(self.outcomes)} ok"
                             + (f", {len(self.skipped)} skipped" if self.skipped else "")}]
        if getattr(ctx, "broken", None):
            checks.append({"name": "bench usable", "ok": False, "detail": ctx.broken})
        if self.injector is not None:
            ctx.manifest_extra.setdefault("faults_injected", {})[self.step.name] = self.injector.fired
        return StepOutcome(ok=ok, checks=checks, cycles=list(self.outcomes), truth_windows=self.truth_windows,
                           data=data)

    def _event(self, cycle: int, stage: str, t_ns: int, *, host: str = "", device: str = "", port: str = "",
               ocs_port: int = 0, offset_ns: int = 0, uncertainty_ns: int = 0, source: str = "") -> Event:
        return Event(self.ctx.run_id, cycle, stage, host, device, port, int(ocs_port), int(t_ns), int(offset_ns),
                     int(uncertainty_ns), source)

    def run_cycle(self, cycle: int, mapping: dict[str, str], current: dict[str, str],
                  record: bool = True) -> CycleOutcome:
        ctx, p = self.ctx, self.p
        causes: list[tuple[str, str]] = []  # (host, source) of every fault met in this cycle
        reconnected = self.reconnected
        old_src, new_src = sources(current), sources(mapping)
        affected = [k for k in (x.key for x in self.ports) if new_src.get(k) != old_src.get(k)]
        try:
            self._drain_stale(causes, reconnected)
        except BenchBroken as exc:  # a host dropped between cycles and cannot be reached again
            return self._latch(cycle, now_ns(), affected, causes, str(exc), record)
        steps_before = {h: s.clock_steps for h, s in self.sessions.items()}
        faults = self.fault_plan.get(cycle, []) if record and self.injector else []
        if any(f.kind == "harness_kill" for f in faults) and ctx.resume_after:
            faults = [f for f in faults if f.kind != "harness_kill"]  # killed once already: not again
        begin = now_ns()
        self.truth_windows.append((cycle if record else -1, begin))
        try:
            if faults:
                self._arm(cycle, faults)
            try:
                timing, first_sent, ocs_causes = self._apply_retrying(ocs_mapping(mapping, self.tx, self.rx))
            except BenchBroken as exc:
                return self._latch(cycle, begin, affected, causes + [("", c) for c in exc.causes], str(exc),
                                   record)
            causes += [("", c) for c in ocs_causes]
            need = {k: set(UP_STAGES if p["probes"] else UP_STAGES[:-1]) for k in affected}
            lost: dict[str, set[str]] = {}
            flaps: dict[str, int] = {}
            kept: dict[tuple[str, str], Observation] = {}
            deadline = Deadline(p["cycle_timeout_s"])
            while any(need.values()) and not deadline.expired():
                try:
                    obs = self.queue.get(timeout=min(0.5, deadline.remaining() or 0.5))
                except queue.Empty:
                    continue
                if obs.kind == "fault":
                    try:
                        cause = self._host_fault(obs, reconnected)
                    except BenchBroken as exc:
                        return self._latch(cycle, begin, affected, causes, str(exc), record,
                                           timing=timing, first_sent=first_sent)
                    if cause:
                        causes.append((obs.host, cause))
                        for x in self.ports:  # the restarted receiver only reports a *new* first probe
                            if x.host == obs.host and (x.key, "port_active") in kept \
                                    and "first_packet" in need.get(x.key, ()):
                                need[x.key].discard("first_packet")
                                lost.setdefault(x.key, set()).add("first_packet")
                    continue
                stage, port = self._classify(obs)
                if port is None or port.key not in need:
                    continue
                if obs.kind == "watch" and obs.interval_ns == 0:
                    # A (re)started watch prints current values. After a reconnect during this cycle, a
                    # stage already reached — once the mirrors have settled, so the old light is gone —
                    # happened while nobody was looking.
                    after_settle = reconnected.get(obs.host, 0) >= first_sent and \
                        self.sessions[obs.host].to_harness(obs.host_ns)[0] > timing.completed_ns
                    for gone, (fld, value) in REACHED.items():
                        if after_settle and (obs.field, obs.value) == (fld, value) and gone in need[port.key]:
                            need[port.key].discard(gone)
                            lost.setdefault(port.key, set()).add(gone)
                            if gone == "port_active" and "first_packet" in need[port.key]:
                                need[port.key].discard("first_packet")
                                lost[port.key].add("first_packet")
                    continue
                if stage == "port_down" and (port.key, "phy_up") in kept:
                    flaps[port.key] = flaps.get(port.key, 0) + 1  # carrier lost with the light on
                if stage is None or (port.key, stage) in kept:
                    continue
                if stage == "first_packet" and obs.value.split()[0].lower() != self.mac_of.get(new_src.get(port.key)):
                    continue  # a probe from the old peer (its flow resumed), not through the new circuit
                t_ns, _, unc = self.sessions[obs.host].to_harness(obs.host_ns - obs.interval_ns // 2)
                if t_ns + unc + obs.interval_ns < first_sent:
                    continue  # happened before this cycle's command
                kept[(port.key, stage)] = obs
                need[port.key].discard(stage)
            done = now_ns()
        finally:
            if faults:
                self.injector.disarm()
        self._check_clocks(steps_before, causes)
        # Convert only now: the clock model has samples closer to (often after) every observation.
        events = [
            self._event(cycle, "ocs_command_sent", first_sent, device=self.ocs, source="harness"),
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
        for key, stages in lost.items():
            x = self.by_key[key]
            events.append(self._event(cycle, "fault", done, host=x.host, device=x.rdma_dev, port=x.netdev,
                                      ocs_port=x.rx, source=f"host:{x.host}: reached while disconnected: "
                                                            f"{'+'.join(sorted(stages))}"))
        for key, count in flaps.items():
            x = self.by_key[key]
            events.append(self._event(cycle, "fault", done, host=x.host, device=x.rdma_dev, port=x.netdev,
                                      ocs_port=x.rx, source=f"link-flap:{key}: carrier dropped {count}x after phy_up"))
        events += [self._event(cycle, "fault", done, host=host, source=cause) for host, cause in causes]
        sources_ = [e.source for e in events if e.stage == "fault"]
        if record:
            ctx.record(events)
            ctx.log.flush()  # durable before the next cycle starts
        return CycleOutcome(cycle, "faulted" if sources_ else "ok", begin, first_sent, timing.completed_ns,
                            done, tuple(affected), missing, tuple(sources_))

    def _arm(self, cycle: int, faults: list) -> None:
        self.injector.arm(cycle, faults)
        for fault in faults:
            if fault.kind == "disk_full":
                from devices.emulated.faults import FullDiskFile

                log = self.ctx.log
                if not isinstance(log._file, FullDiskFile):  # a wrapper around the log's file object
                    log._file = FullDiskFile(log._file)
                log._file.armed = True
                self.injector.fired.append({"cycle": cycle, "kind": "disk_full", "target": str(log.path),
                                            "t_ns": now_ns()})

    def _latch(self, cycle: int, begin: int, affected: list[str], causes: list[tuple[str, str]], why: str,
               record: bool, *, timing=None, first_sent: int | None = None) -> CycleOutcome:
        """Latch the bench broken: record this cycle as faulted with the cause, and stop."""
        self.ctx.broken = why
        self.ctx.say(f"[red]bench latched broken:[/] {why}")
        done = now_ns()
        events = []
        if first_sent is not None:
            events.append(self._event(cycle, "ocs_command_sent", first_sent, device=self.ocs, source="harness"))
        events += [self._event(cycle, "fault", done, host=h, source=c) for h, c in causes]
        events.append(self._event(cycle, "fault", done, source=f"broken:{why}"[:300]))
        if record:
            self.ctx.record(events)
            self.ctx.log.flush()
        return CycleOutcome(cycle, "faulted", begin, first_sent or begin,
                            timing.completed_ns if timing else done, done, tuple(affected), {},
                            tuple(e.source for e in events if e.stage == "fault"))

    def _check_clocks(self, steps_before: dict[str, int], causes: list[tuple[str, str]]) -> None:
        """Probe every host's clock now, so a step during the cycle is caught before its events are
        converted; a step (found now or by the background sync) labels the cycle."""
        n = self.p["clock_check_probes"]
        pipelined = False
        if n == 1:
            try:
                HostSession.sync_clocks_together(list(self.sessions.values()))
                pipelined = True
            except DeviceError:
                pass  # find out which host failed, one by one
        for host, session in self.sessions.items():
            if n > 0 and not pipelined:
                try:
                    session.sync_clock(count=n)
                except DeviceError as exc:  # a drop: its stream faults arrive in the next cycle
                    causes.append((host, f"host:{host}: clock probe failed: {str(exc)[:200]}"))
            if session.clock_steps > steps_before.get(host, 0):
                step = session.clock.steps[-1]
                causes.append((host, f"clock-step:{host}: {step.jump_ns / 1e6:+.3f} ms"))

    def _warm_up_clocks(self) -> None:
        """Drift is only known over a span of samples: make sure the first measured cycle has one."""
        first = min(s.clock.segments[-1].first_t for s in self.sessions.values())
        wait = self.p["clock_warmup_s"] - (now_ns() - first) / 1e9
        if wait > 0:
            threading.Event().wait(wait)

    def _drain_stale(self, causes: list[tuple[str, str]], reconnected: dict[str, int]) -> None:
        """Drop what arrived between cycles; a host that dropped meanwhile is reconnected now (and the
        cycle labelled with the cause)."""
        while True:
            try:
                obs = self.queue.get_nowait()
            except queue.Empty:
                return
            if obs.kind == "fault":
                cause = self._host_fault(obs, reconnected)
                if cause:
                    causes.append((obs.host, cause))

    def _classify(self, obs: Observation) -> tuple[str | None, _PortInfo | None]:
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


def _where(node, step, key=None) -> tuple[str | None, int | None]:
    """(file, line) of a playbook node (or one of its keys), else the step's."""
    where = getattr(node, "where", None)
    if where is not None:
        try:
            return where(key) if key is not None else where()
        except (KeyError, TypeError):
            pass
    return step.file, step.line


@register_step("turnaround", SCHEMA, resume_point=resume_after_logged)
def turnaround(ctx, step) -> StepOutcome:
    run = TurnaroundRun(ctx, step)
    try:
        result = run.run()
    except BaseException:
        # The run stops (disk full, signal, ...): leave what was measured for the record and ground truth.
        ctx.results[step.name] = StepOutcome(ok=False, cycles=list(run.outcomes), truth_windows=run.truth_windows,
                                             data={"faults_injected": run.injector.fired if run.injector else []})
        if run.injector is not None:
            ctx.manifest_extra.setdefault("faults_injected", {})[step.name] = run.injector.fired
        raise
    ctx.manifest_extra.setdefault("turnaround_steps", []).append(step.name)
    return result
