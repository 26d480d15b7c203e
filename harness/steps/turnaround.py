"""The turnaround step: reconfigure, then timestamp every stage on every affected port.

Per cycle: apply the next mapping through the run's CircuitGuard of each switch the ports are on
(ocs_command_sent / ocs_command_completed on the harness clock, per switch; several switches are commanded at
once, each port's stages bounded from its own switch's send; docs/turnaround.md, "Several switches"), then
`expect` from the observation log what the hosts' agents report — Rx LOS/LOL, carrier, port state, first
probe — and convert it to stage events (harness.bench.stages), durable before
the next cycle starts. Retries, reconnects, restore, stale reports and clock checks are the bench
runtime's (harness.bench); a fault labels the cycle `faulted` with a `fault` event naming the cause, and an
unrecoverable one latches the bench broken (`ctx.broken`) so the rest of the run is skipped. `faults:`
injects faults on the emulated bench (docs/faults.md).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, NamedTuple

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from analysis.stages import PORT_CHAIN
from devices.errors import DeviceError
from devices.timing import Deadline, now_ns
from harness import logs
from harness.bench import BenchBroken
from harness.bench.circuits import Applied, CircuitGuard, RetryPolicy
from harness.bench.hosts import HostGroup
from harness.bench.live import FaultEntry
from harness.bench.observe import CycleWatch
from harness.bench.stages import CycleEvents, OcsCommand, OcsStamps, PortRef, cycle_events, ocs_events
from harness.config import register_step
from harness.errors import InputError
from harness.eventlog import encode
from harness.events import Event
from harness.gpu_view import gpu_view
from harness.specs import Count, Field, Interval, Port, Seconds, Spec
from harness.patterns import cycle_mappings, sources
from harness.outcome import Check, CycleOutcome, CycleOutcomes, IntRows, StepOutcome, resume_after_logged

class TurnaroundParams(Spec):
    """Measure the reconfiguration turnaround, cycle by cycle, on NIC ports of one or several OCSs (a port's
    peer in every cycle is on its own switch)."""

    cycles: Count = Field(0, description="cycles to run; 0: the playbook's (or --cycles) value")
    pattern: str = "ring-shift"
    schedule: str = ""
    ports: list[str] = Field([], description='NIC port keys "host:netdev"; empty: every port in the inventory')
    watch_interval_us: Interval = 200
    ethtool_interval_us: Interval = 1000
    probes: bool = True
    probe_interval_us: Interval = 100
    probe_gap_us: Count = 2000
    udp_port: Port = 4791
    cycle_timeout_s: Seconds = 60.0
    settle_s: Seconds = 0.0
    clock_resync_s: Seconds = Field(0.5, description="background re-estimation period per host")
    clock_warmup_s: Seconds = Field(1.5, description="clock samples to gather before cycle 1 (drift needs a span)")
    clock_check_probes: Count = Field(1, description="clock probes per host after each cycle (catches steps); 0: off")
    ocs_timeout_s: Seconds = Field(10.0, description="deadline of one OCS command")
    retries: Count = Field(3, description="OCS command retries, and host reconnects per drop, before the bench "
                                          "is latched")
    retry_backoff_s: Seconds = Field(0.1, description="first backoff; doubles per retry")
    teardown_s: Seconds = Field(15.0, description="the restore at the end of the run must finish within this")
    late_report_ms: Seconds = Field(50.0, description="once a port's last stage is in, how long to await "
                                                      "earlier polled ones")
    faults: list[FaultEntry] = Field([], description="emulated bench only: the declared fault kinds, each on "
                                                    "`cycles: [..]` or with `probability: p`")


class CyclePlan(NamedTuple):
    """What a cycle needs of its mapping before its command, made from the mapping before it."""

    current: dict[str, str]
    mapping: dict[str, str]
    new_src: dict[str, str]  # port key -> the source lighting it
    affected: list[str]  # the ports whose source changes
    ocs_maps: dict[str, dict[int, int]]  # per switch: its cross-connects


class SwitchCommand:
    """One switch's part of a cycle's reconfiguration: its guarded apply up to the write (`begin`), then its
    reply awaited on the guard's thread (`finish`), or here with its retries if the first attempt failed before
    its write."""

    def __init__(self, ocs: str, guard: CircuitGuard, ocs_map: dict[int, int]):
        self.ocs, self.guard, self.map = ocs, guard, ocs_map
        self.command = None
        self.reply: Future | None = None  # of its Applied, while awaited on the guard's thread
        self.applied: Applied | None = None

    def begin(self, policy: RetryPolicy) -> None:
        self.command = self.guard.begin(self.map, policy)

    @property
    def sent(self) -> int:
        """When the change went out (0: not known, the command never written)."""
        if self.applied is not None:
            return self.applied.first_sent_ns
        return self.command.sent_ns if self.command is not None else 0

    def finish(self, next_map: dict[int, int] | None, on_done: Callable[[], None]) -> Future:
        plan_next = (lambda: self.guard.plan_ahead(next_map)) if next_map is not None else None
        if self.command.sent_ns:
            # The change is on the wire. Its reply (the switch settled: tens of ms) is awaited on the guard's
            # thread, which then plans the next command from it, while the step's thread feeds the host lines
            # that come meanwhile: blocked on the reply, it found them queued, and a reply that came late left it
            # behind the cycle's last lines (docs/turnaround.md).
            self.reply = self.guard.finish_later(self.command, on_done, then=plan_next)
            return self.reply
        self.applied = self.command.finish()  # when the change went out, the retries say
        if plan_next is not None:
            plan_next()
        done = Future()
        done.set_result(self.applied)
        return done

    def result(self) -> Applied:
        """Its Applied, the reply awaited (raises the guard's BenchBroken)."""
        if self.reply is not None:
            self.applied, self.reply = self.reply.result(), None
        return self.applied

    def abandon(self) -> None:
        """A write made while another switch's begin failed: await it here, so the driver is left in order."""
        if self.command is not None and self.command.sent_ns and self.applied is None and self.reply is None:
            try:
                self.applied = self.command.finish()
            except Exception:  # the cycle is failing already; the restore reads the switch afresh
                pass

    def event(self) -> OcsCommand:
        a = self.result()
        return OcsCommand(self.ocs, a.first_sent_ns, a.timing.completed_ns, a.ocs_stamps)


def latest_reply(replies: list[Future], wake: Callable[[], None]) -> Future:
    """One Future for several switches' replies: done when all are, with the latest reply's Applied (what a
    cycle's watch waits for), or the first failure; `wake()` once it is done."""
    combined: Future = Future()
    left = [len(replies)]
    lock = threading.Lock()

    def one_done(_) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        failed = next((f.exception() for f in replies if f.exception() is not None), None)
        if failed is not None:
            combined.set_exception(failed)
        else:
            combined.set_result(max((f.result() for f in replies), key=lambda a: a.timing.completed_ns))
        wake()

    for reply in replies:
        reply.add_done_callback(one_done)
    return combined


class TurnaroundRun:
    def __init__(self, ctx, step):
        self.ctx, self.step, self.p = ctx, step, step.params
        self.cycles = self.p["cycles"] or ctx.cycles
        nics = {n.key: n for n in ctx.bench.inventory.nic_ports}
        wanted = self.p["ports"] or list(nics)
        unknown = [k for k in wanted if k not in nics]
        if unknown:
            raise InputError(f"step {step.name}: unknown NIC port(s) {', '.join(map(str, unknown))}; known: "
                             f"{', '.join(nics)}", step.file, step.line)
        self.nics = [nics[k] for k in wanted]
        self.switches = list(dict.fromkeys(n.ocs for n in self.nics))  # in the ports' order
        self.ocs = self.switches[0]
        self.ocs_of = {n.key: n.ocs for n in self.nics}
        self.ports = {n.key: PortRef(n.key, n.host, n.netdev, n.rdma_dev, n.ocs_rx, n.ocs) for n in self.nics}
        self.port_of = {(n.host, n.netdev): n.key for n in self.nics}
        self.tx = {n.key: n.ocs_tx for n in self.nics}
        self.rx = {n.key: n.ocs_rx for n in self.nics}
        self.chain = PORT_CHAIN if self.p["probes"] else PORT_CHAIN[:-1]
        self.policy = RetryPolicy(self.p["retries"], self.p["retry_backoff_s"], self.p["ocs_timeout_s"])
        self.outcomes = CycleOutcomes()  # compact: a campaign's memory must not grow with its cycles
        self.per_switch: dict[str, list[tuple[int, int]]] = {o: [] for o in self.switches}  # (command, turnaround)
        self._issuers: ThreadPoolExecutor | None = None  # begins the other switches' commands with the first's
        self.truth_windows = IntRows(2)  # (cycle, harness ns the cycle began)
        self.skipped: list[int] = []  # cycles not run because the bench was latched broken
        self.settling_faults: list[str] = []  # the unmeasured first cycle's fault sources (recorded as cycle 0)
        self.mac_of: dict[str, str] = {}  # port key -> MAC its probes carry
        self._leftover: tuple | None = None  # the last cycle's, dealt with once the next command is out
        self._check: int | None = None  # the last cycle, its clock check not yet asked for (`ask_check`)
        self._ahead: CyclePlan | None = None  # the next cycle's, made in this one's wait
        self.faults = ctx.bench.faults(step, self.p["faults"], self.cycles, list(self.ports))

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        ctx, p = self.ctx, self.p
        self.guards = {ocs: ctx.bench.circuits(ocs, teardown_s=p["teardown_s"]) for ocs in self.switches}
        if ctx.dry_run:
            return
        if len(self.switches) > 1:
            self._issuers = ThreadPoolExecutor(len(self.switches) - 1, thread_name_prefix="ocs-begin")
            ctx.stack.callback(self._issuers.shutdown, wait=False)
        self.log = ctx.bench.observe()
        self.hosts = HostGroup(ctx.bench.hosts.open(sorted({n.host for n in self.nics})),
                               retries=p["retries"], backoff_s=p["retry_backoff_s"])
        self.mac_of = self.hosts.observe(self.nics, self.log, watch_us=p["watch_interval_us"],
                                         ethtool_us=p["ethtool_interval_us"], clock_resync_s=p["clock_resync_s"],
                                         probe_us=p["probe_interval_us"] if p["probes"] else 0,
                                         probe_gap_us=p["probe_gap_us"], udp_port=p["udp_port"])

    # ------------------------------------------------------------------ cycles
    def run(self) -> StepOutcome:
        ctx = self.ctx
        rng = ctx.rng(f"turnaround:{self.step.name}")
        if ctx.broken:
            return StepOutcome.skipped(ctx.broken)
        self.setup()
        # What is alive now (modules, the bench, its sessions) lives for the step: the cyclic GC's full
        # collections need not scan it again. Unfrozen, they scanned ~150 k import-time objects, ~90 ms each,
        # inside whichever cycle allocated at that moment. During the cycles the collector runs only where
        # `collect_young` says: once a cycle, in its physical wait.
        gc.freeze()
        automatic = gc.isenabled()
        gc.disable()
        try:
            return self._cycles(rng)
        finally:
            gc.unfreeze()
            if automatic:
                gc.enable()

    def _cycles(self, rng) -> StepOutcome:
        ctx, p = self.ctx, self.p
        keys = list(self.ports)
        current: dict[str, str] = {}
        self.progress = progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[last]}"), TimeElapsedColumn(), disable=ctx.quiet,
                            transient=False, console=logs.console())
        with progress:
            self.task = task = progress.add_task("turnaround", total=self.cycles, last="")
            resume = ctx.resume_after.get(self.step.name, 0)
            progress.update(task, completed=resume)
            schedule = str(self.step.resolve_path(p["schedule"])) if p["schedule"] else ""
            plan = self._mappings(keys, rng, schedule)
            for at, (cycle, mapping) in enumerate(plan[resume:], resume):
                if ctx.dry_run:
                    maps = self._plan({}, mapping).ocs_maps
                    ctx.say(f"cycle {cycle}: " + "; ".join(
                        (f"{ocs} " if len(maps) > 1 else "") + ", ".join(f"{i}->{e}" for i, e in sorted(m.items()))
                        for ocs, m in maps.items()))
                    for ocs, ocs_map in maps.items():
                        self.guards[ocs].switch.apply(ocs_map, exclusive=True)
                    continue
                if ctx.broken:
                    self.skipped.append(cycle)
                    continue
                measured = cycle != resume  # the first cycle brings the bench into the pattern's state
                if not measured:
                    current = self._found()
                outcome = self.run_cycle(cycle, mapping, current, record=measured,
                                         upcoming=plan[at + 1][1] if at + 1 < len(plan) else None)
                current = mapping
                if not measured:
                    self.hosts.warm_up(p["clock_warmup_s"])
                    continue
                self.outcomes.append(outcome)
                if p["settle_s"] > 0:
                    threading.Event().wait(p["settle_s"])
            self.finish_checks()
        return self.outcome()

    def _mappings(self, keys: list[str], rng, schedule: str) -> list[tuple[int, dict[str, str]]]:
        """The pattern's mapping per cycle. Over several switches each switch's ports follow the pattern among
        themselves (its own random stream), as a fibre goes only where its switch reaches; a schedule names
        every pair itself, each within one switch."""
        p = self.p
        if len(self.switches) == 1 or p["pattern"] == "schedule":
            plan = list(cycle_mappings(p["pattern"], keys, self.cycles, rng, schedule))
        else:
            parts = [list(cycle_mappings(p["pattern"], [k for k in keys if self.ocs_of[k] == ocs], self.cycles,
                                         self.ctx.rng(f"turnaround:{self.step.name}:{ocs}")))
                     for ocs in self.switches]
            plan = [(cycle, {s: d for part in cycle_parts for s, d in part[1].items()})
                    for cycle, cycle_parts in enumerate(zip(*parts))]
        for cycle, mapping in plan:
            across = [f"{s} ({self.ocs_of[s]}) -> {d} ({self.ocs_of[d]})" for s, d in mapping.items()
                      if self.ocs_of[s] != self.ocs_of[d]]
            if across:
                raise InputError(f"step {self.step.name}: cycle {cycle} pairs ports on different switches: "
                                 f"{', '.join(across[:3])}; a circuit stays within one switch",
                                 self.step.file, self.step.line)
        return plan

    def outcome(self) -> StepOutcome:
        ok = all(o.status == "ok" for o in self.outcomes) and not self.skipped
        checks = [Check(name="all cycles completed", ok=ok,
                        detail=f"{sum(o.status == 'ok' for o in self.outcomes)}/{len(self.outcomes)} ok"
                               + (f", {len(self.skipped)} skipped" if self.skipped else ""))]
        if self.settling_faults:
            ok = False
            checks.append(Check(name="bench brought into the pattern's first state", ok=False,
                                detail="; ".join(self.settling_faults)[:1000]))
        if self.ctx.broken:
            checks.append(Check(name="bench usable", ok=False, detail=self.ctx.broken))
        self.faults.record()
        summary, summary_md = self.switch_summary()
        return StepOutcome(ok=ok, checks=checks, cycles=self.outcomes, truth_windows=self.truth_windows,
                           summary=summary, summary_md=summary_md,
                           data={"ports": list(self.ports), "ocs": self.ocs, "switches": self.switches,
                                 "skipped_cycles": self.skipped, "faults_injected": self.faults.fired})

    def switch_summary(self) -> tuple[dict, str]:
        """Over several switches, each one's own numbers (ms): its command (completed − sent) and its
        turnaround (its ports' last first packet, or last stage, − its send), p50 and p99 over the ok cycles."""
        from analysis.stats import summarize

        if len(self.switches) < 2:
            return {}, ""
        summary, lines = {}, [f"## Per switch ({self.step.name})", "",
                              "| switch | cycles | command p50 (ms) | p99 | turnaround p50 (ms) | p99 |",
                              "|---|---:|---:|---:|---:|---:|"]
        for at, (ocs, rows) in enumerate(self.per_switch.items()):
            command = summarize([c / 1e6 for c, _ in rows], self.ctx.seed + at)
            turn = summarize([t / 1e6 for _, t in rows], self.ctx.seed + 100 + at)
            summary[f"{ocs}_cycles"] = len(rows)
            for name, s in (("command", command), ("turnaround", turn)):
                summary[f"{ocs}_{name}_p50_ms"], summary[f"{ocs}_{name}_p99_ms"] = s["p50"], s["p99"]
            lines.append(f"| {ocs} | {len(rows)} | {command['p50']:.3f} | {command['p99']:.3f} | "
                         f"{turn['p50']:.3f} | {turn['p99']:.3f} |")
        return summary, "\n".join(lines) + "\n"

    def run_cycle(self, cycle: int, mapping: dict[str, str], current: dict[str, str],
                  record: bool = True, upcoming: dict[str, str] | None = None) -> CycleOutcome:
        ahead = self._ahead
        _, _, new_src, affected, ocs_maps = ahead if ahead is not None and ahead.current is current and \
            ahead.mapping is mapping else self._plan(current, mapping)
        commands = [SwitchCommand(ocs, self.guards[ocs], ocs_map) for ocs, ocs_map in ocs_maps.items()]
        single = len(commands) == 1
        sent = completed = finishing = None
        causes: list[tuple[str, str]] = []
        begin = now_ns()
        try:
            causes += self.log.drain(self.hosts.on_fault)  # a host that dropped between cycles: reconnect it
            if not record:
                causes += self.hosts.unwatched  # a watch not live yet may miss this cycle's changes
            begin = now_ns()
            self.hosts.cycle_started(cycle if record else -1, begin)
            self.truth_windows.append((cycle if record else -1, begin))
            with self.faults.armed(cycle, measured=record):
                self._begin(commands)
                if upcoming is not None:  # the next cycle is planned while this one's circuits settle
                    self._ahead = self._plan(mapping, upcoming)
                next_maps = self._ahead.ocs_maps if upcoming is not None else {}
                replies = [c.finish(next_maps.get(c.ocs), self.log.wake if single else lambda: None)
                           for c in commands]
                if all(r.done() for r in replies):  # every first attempt failed before its write: retried here
                    completed = max(r.result().timing.completed_ns for r in replies)
                else:
                    finishing = replies[0] if single else latest_reply(replies, self.log.wake)
                sent = min(c.sent for c in commands)
                self.ask_check()  # the command is out: the last cycle's check and leftovers cost it nothing now
                self.after_command()
                collect_young()
                built = CycleEvents(self.ctx.run_id, cycle, self.ports, sent, self.hosts.convert, self.chain,
                                    self.hosts.clock_generation, encode,
                                    sent_by_ocs=None if single else {c.ocs: c.sent for c in commands})
                watch = CycleWatch({k: set(self.chain) for k in affected}, self.port_of, sent, completed,
                                   self.hosts.convert, peer_mac={k: self.mac_of.get(new_src.get(k)) for k in affected}
                                   if self.p["probes"] else None, reconnected=self.hosts.reconnected,
                                   chain=self.chain, grace_ns=int(self.p["late_report_ms"] * 1e6),
                                   suspect=lambda host: self.hosts.request_check(cycle if record else -1, 1),
                                   events=built, liveness=self.hosts)
                arrivals = self.log.expect(watch, Deadline(self.p["cycle_timeout_s"]), self.hosts.on_fault,
                                           finishing)
                if finishing is not None:
                    finishing.result()  # raises the guard's BenchBroken
                    finishing = None
                issued = tuple(c.event() for c in commands)
                completed = max(c.completed_ns for c in issued)
                causes += [("", cause) for c in commands for cause in c.applied.causes]
                if arrivals.missing:
                    self.ctx.say(f"[yellow]cycle {cycle}: timed out after {self.p['cycle_timeout_s']} s[/] — "
                                 f"{watch.describe()}")
                for host, silence in watch.stalled.items():
                    self.ctx.say(f"[yellow]cycle {cycle}: {host}'s watch silent {silence / 1e6:.0f} ms[/] — its "
                                 f"ports' unreported stages unobserved, the cycle faulted")
        except BenchBroken as exc:
            # a host dropped for good, or one switch failed, while the switches settled: let them end first
            concurrent.futures.wait([c.reply for c in commands if c.reply is not None])
            return self._latch(cycle, begin, affected, causes + [("", c) for c in exc.causes], str(exc), record,
                               commands)
        self.hosts.cycle_ended(arrivals.done_ns)
        cpu = time.process_time_ns(), time.thread_time_ns()  # the cycle's end, for its raw record
        # the checks asked for so far, those finished (normally all: the last one ran in this cycle's physical
        # wait); one still running labels the cycles it finds later, as an appended fault event
        labels = self.hosts.clock_labels(timeout_s=0)
        arrivals.causes = causes + arrivals.causes + labels.pop(cycle if record else -1, [])
        # the ports built while the cycle waited are built again only where an observation or a clock
        # step came after (docs/turnaround.md, "The cycle's end")
        events, encoded = cycle_events(self.ctx.run_id, cycle, self.ports, self.ocs, sent, completed, arrivals,
                                       self.hosts.convert, self.chain, built, watch.version, issued[0].stamps,
                                       () if single else issued)
        faults = tuple(e.source for e in events if e.stage == "fault")
        if record:
            late = self._label_written(labels)
            self._record(late + events, [encode(e) for e in late] + encoded)
            # Kept until the next command is out: freeing the cycle's ~2 000 objects (events, their lines, the
            # watch's maps) at this function's return took ~0.2 ms between the cycles.
            self._leftover = (cycle, sent, completed, arrivals, cpu, issued, events, (built, watch, encoded))
            if not single and not faults:
                self._per_switch(issued, events)
        elif faults:
            self._record_settling(events, arrivals)
        # This cycle's clock check runs on the clock thread once the next command is out, in its physical wait
        # (docs/turnaround.md, "Clock checks"): its events were converted with the samples taken up to now; a
        # step that only the check finds labels this cycle when a later one ends (an appended fault event).
        # Asked for then, not here, so that its probes' Python (sends, replies, the tracker's fits) contends
        # neither with the write nor with the way to the next command.
        self._check = cycle if record else -1
        return CycleOutcome(cycle, "faulted" if faults else "ok", begin, sent, completed, arrivals.done_ns,
                            tuple(affected), arrivals.missing, faults)

    def _found(self) -> dict[str, str]:
        """What the switches show now, as our ports' mapping: the unmeasured first cycle waits only for the
        ports it changes (a resume finds the switches in the state the killed run left, often the very one it
        starts from, and nothing would come). A switch that cannot be read: its ports expected to change."""
        found = {}
        for ocs in self.switches:
            keys = [k for k in self.tx if self.ocs_of[k] == ocs]
            by_ingress, by_egress = {self.tx[k]: k for k in keys}, {self.rx[k]: k for k in keys}
            try:
                patches = self.guards[ocs].switch.patches()
            except DeviceError:
                continue
            found.update({by_ingress[i]: by_egress[e] for i, e in patches.items()
                          if i in by_ingress and e in by_egress})
        return found

    def _begin(self, commands: list[SwitchCommand]) -> None:
        """Every switch's command up to its write: the first's on this thread, the others' at the same time on
        the issuers' threads (one per further switch), so no switch's write waits for another's. If one fails
        (a permanent refusal, a port not allowed), the writes made are awaited before it is raised."""
        others = [self._issuers.submit(c.begin, self.policy) for c in commands[1:]]
        failed = None
        try:
            commands[0].begin(self.policy)
        except BaseException as exc:
            failed = exc
        for future in others:
            if future.exception() is not None and failed is None:
                failed = future.exception()
        if failed is not None:
            for c in commands:
                c.abandon()
            raise failed

    def _per_switch(self, issued: tuple[OcsCommand, ...], events: list) -> None:
        """Each switch's command time and turnaround in an ok cycle (its ports' last chain stage − its send)."""
        last = self.chain[-1]
        for c in issued:
            up = [e.t_ns for e in events
                  if e.stage == last and self.ocs_of.get(self.port_of.get((e.host, e.port), "")) == c.ocs]
            if up:
                self.per_switch[c.ocs].append((c.completed_ns - c.sent_ns, max(up) - c.sent_ns))

    def _plan(self, current: dict[str, str], mapping: dict[str, str]) -> CyclePlan:
        old_src, new_src = sources(current), sources(mapping)
        maps: dict[str, dict[int, int]] = {ocs: {} for ocs in self.switches}
        for src, dst in mapping.items():
            maps[self.ocs_of[src]][self.tx[src]] = self.rx[dst]
        return CyclePlan(current, mapping, new_src, [k for k in self.ports if new_src.get(k) != old_src.get(k)], maps)

    def _label_written(self, labels: dict[int, list[tuple[str, str]]]) -> list[Event]:
        """Fault events for cycles already written that a late clock check found a step in (their outcome
        turns faulted); -1, the unmeasured first cycle, has nothing to label."""
        events = []
        for cycle, causes in sorted(labels.items()):
            index = self.outcomes.index_of(cycle)
            if index is None:
                continue
            done = self.outcomes[index].done_ns
            late = [Event(self.ctx.run_id, cycle, "fault", host, "", "", 0, done, 0, 0,
                          f"{cause} (found after the cycle was written; its times are not corrected for it)"[:300])
                    for host, cause in causes]
            self.outcomes[index] = dataclasses.replace(self.outcomes[index], status="faulted", causes=(
                *self.outcomes[index].causes, *(e.source for e in late)))
            events += late
        return events

    def after_command(self) -> None:
        """What the last measured cycle leaves that its events' durability does not need, done once the next
        command is out, or when the step ends — not between the cycle's end and that command: its inputs,
        raw, to observations.jsonl (`harness report` converts them again; a run killed in that window loses
        this one record, not the cycle's events), its line on the progress bar, and freeing its objects."""
        if self._leftover is not None:
            cycle, sent, completed, arrivals, (cpu, step_cpu), issued, events, _ = self._leftover
            self._leftover = None
            self.log.cycle(cycle, sent, completed, self.ocs, self.ports, arrivals, cpu_ns=cpu, step_cpu_ns=step_cpu,
                           ocs_stamps=issued[0].stamps, commands=issued if len(issued) > 1 else ())
            self.log.flush()
            self.ctx.log.spill()  # a row group of events to Parquet, when enough are durable
            up = max((e.t_ns for e in events if e.stage in self.chain), default=arrivals.done_ns)
            index = self.outcomes.index_of(cycle)
            status = self.outcomes[index].status if index is not None else ""
            self.progress.update(self.task, advance=1, last=f"{status} {(up - sent) / 1e6:8.1f} ms")

    def ask_check(self) -> None:
        """Ask for the last cycle's clock check, once the next command is out (or the step ends)."""
        if self._check is not None:
            self.hosts.request_check(self._check, self.p["clock_check_probes"])
            self._check = None

    def finish_checks(self) -> None:
        """The last cycle's clock check has no next cycle to overlap: wait for it and write its labels."""
        self.ask_check()
        self.after_command()
        if not self.outcomes or self.ctx.broken or self.ctx.dry_run:
            return
        late = self._label_written(self.hosts.clock_labels())
        if late:
            self._record(late)

    def _record_settling(self, events: list[Event], arrivals=None) -> None:
        """The unmeasured first cycle's faults, recorded as cycle 0 (the state a run starts from; after a
        resume this cycle repeats a measured one, which stays as measured). Its stage events are not
        recorded, so a timeout names what did arrive."""
        seen = {}
        for key, stage in arrivals.kept if arrivals is not None else ():
            seen.setdefault(key, set()).add(stage)
        faults = []
        for e in events:
            if e.stage != "fault":
                continue
            source = f"settling: {e.source}"
            if e.source.startswith("timeout:"):
                got = seen.get(self.port_of.get((e.host, e.port)), set())
                saw = ", ".join(s for s in self.chain if s in got) or "nothing"
                source += f" after {self.p['cycle_timeout_s']:g} s; saw {saw}"
            faults.append(dataclasses.replace(e, cycle=0, source=source[:300]))
        self.settling_faults += [e.source for e in faults]
        self._record(faults)

    def _record(self, events: list[Event], encoded: list | None = None) -> None:
        self.ctx.record(events, encoded)
        self.ctx.log.flush()  # durable (fsynced) before the next command; the raw lines' mirror after it

    def _latch(self, cycle: int, begin: int, affected: list[str], causes: list[tuple[str, str]], why: str,
               record: bool, commands: list[SwitchCommand]) -> CycleOutcome:
        """Latch the bench broken: record this cycle as faulted with the cause, and stop. Each switch's command
        is recorded as far as it went: sent if it was written, completed if its reply came."""
        self.after_command()
        self.ctx.latch_broken(why)
        self.ctx.say(f"[red]bench latched broken:[/] {why}")
        done = now_ns()
        mk = lambda stage, t, **kw: Event(self.ctx.run_id, cycle, stage, kw.get("host", ""),  # noqa: E731
                                          kw.get("device", ""), "", 0, t, 0, 0, kw["source"])
        events, sent, completed = [], None, None
        for c in commands:
            if c.reply is not None and c.reply.done() and c.reply.exception() is None:
                c.result()
            if c.sent:
                applied = c.applied if c.applied is not None and c.reply is None else None
                done_ns = applied.timing.completed_ns if applied is not None else None
                events += ocs_events(self.ctx.run_id, cycle, c.ocs, c.sent, done_ns,
                                     applied.ocs_stamps if applied is not None else OcsStamps())
                sent = min(sent or c.sent, c.sent)
                completed = max(completed or 0, done_ns or 0) or None
        events += [mk("fault", done, host=h, source=c) for h, c in causes]
        events.append(mk("fault", done, source=f"broken:{why}"[:300]))
        if record:
            self._record(events)
            self.progress.update(self.task, advance=1, last="latched broken")
        else:
            self._record_settling(events)
        return CycleOutcome(cycle, "faulted", begin, sent or begin, completed or done, done, tuple(affected), {},
                            tuple(e.source for e in events if e.stage == "fault"))


def collect_young() -> None:
    """The cyclic GC's work for one cycle, done in its physical wait (automatic collection is off during the
    cycles): the objects made since the last call that are garbage in a cycle now are collected, and what
    survives is frozen — the run's records (a cycle's ~450 event rows stay for the run) would otherwise be
    scanned again by every later collection. Automatic, an 8x8 run of 150 cycles spent ~2.5 ms a cycle in
    the collector (645 young, 58 middle and 5 full collections of ~25 ms), landing in whichever cycle
    allocated then: its burst of host lines or the write between cycles; this way, ~0.34 ms a cycle (one
    young collection), in the physical wait."""
    gc.collect(0)
    gc.freeze()


@register_step("turnaround", TurnaroundParams, resume_point=resume_after_logged)
def turnaround(ctx, step) -> StepOutcome:
    run = TurnaroundRun(ctx, step)
    try:
        with gpu_view(ctx, step, {n.host for n in run.nics}):  # the GPUs' side of each reconfiguration
            outcome = run.run()
    except BaseException:
        # The run stops (disk full, signal, ...): leave what was measured for the record and ground truth.
        ctx.results[step.name] = StepOutcome(ok=False, cycles=run.outcomes, truth_windows=run.truth_windows,
                                             data={"faults_injected": run.faults.fired})
        if ctx.observations is not None:
            run.after_command()
        run.faults.record()
        raise
    return outcome
