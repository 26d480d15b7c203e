"""Playbook execution: resolve the bench, open drivers lazily, run steps, keep the run record.

Teardown is one ExitStack unwound in reverse order on success, error, SIGINT and SIGTERM, so circuits are
restored and connections closed however the run ends; each restore is bounded in time. A step that meets
an unrecoverable fault latches the bench broken (`ctx.broken`): later steps are skipped, not attempted.
On an inventory (real or external emulated) the run holds a lease on every OCS (harness.lock) from start to
the end of teardown, and every run holds its run directory (harness.lock.RunDirLock).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from datetime import datetime, timezone
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import DeviceError
from devices.protocols import CircuitSwitch
from devices.resources import Bench
from harness import logs, resume
from harness import record as rec
from harness.bench.emulated import load_profile
from harness.bench.live import LiveBench
from harness.benchspec import BENCH_KINDS, NETNS_KINDS, emulated_spec
from harness.config import MAX_CYCLES, STEP_TYPES, Playbook, load_inventory, load_playbook
from harness.errors import Aborted, InputError
from harness.eventlog import EventLog
from harness.events import Event
from harness.finish import console_summary, finish_run
from harness.outcome import StepOutcome


@dataclass
class RunOptions:
    playbook: str
    bench: str | None = None
    out: str | None = None
    seed: int | None = None
    cycles: int | None = None
    resume: str | None = None
    dry_run: bool = False
    quiet: bool = False
    json: bool = False  # one result line on stdout
    junit: str | None = None  # also write the record as JUnit XML there
    adopt_current_state: bool = False  # take a switch another run left changed as the original


@dataclass
class RunContext:
    """Everything a step may use. Drivers open on first use and close when the run ends."""

    playbook: Playbook
    inventory: Bench
    run_dir: Path
    run_id: str
    seed: int
    cycles: int
    log: EventLog
    stack: contextlib.ExitStack  # connections and emulators: closed last
    teardown: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # bench restores: before the record
    emulated: Any = None  # EmulatedBench when the bench is emulated (the runner's and the record's; steps: bench.truth)
    bench: LiveBench | None = None  # the bench as a step sees it (set once the inventory is open)
    dry_run: bool = False
    quiet: bool = False
    results: dict[str, StepOutcome] = field(default_factory=dict)
    resume_after: dict[str, int] = field(default_factory=dict)  # step name -> last cycle already logged
    manifest_extra: dict[str, Any] = field(default_factory=dict)
    broken: str | None = None  # set by a step on an unrecoverable fault: the rest of the run is skipped
    lease: Any = None  # harness.lock.BenchLease on a real bench
    guards: dict[str, Any] = field(default_factory=dict)  # OCS name -> harness.bench.circuits.CircuitGuard
    observations: Any = None  # harness.bench.observe.ObservationLog, opened by the first step that observes
    _switches: dict[str, CircuitSwitch] = field(default_factory=dict)
    _sessions: dict[str, Any] = field(default_factory=dict)
    _transports: dict[str, Any] = field(default_factory=dict)  # SSH connections opened before their host's session

    def latch_broken(self, why: str) -> None:
        """Latch the bench broken (the first cause stands): the rest of the run is skipped, not attempted."""
        self.broken = self.broken or why

    def rng(self, stream: str) -> np.random.Generator:
        """An independent, reproducible random stream per purpose (same seed → same stream on resume)."""
        key = [self.seed] + [ord(c) for c in stream]
        return np.random.default_rng(key)

    def switch(self, name: str | None = None) -> CircuitSwitch:
        name = name or next(iter(self.inventory.ocs))
        if name not in self._switches:
            from devices.ocs import open_switch

            resource = self.inventory.ocs[name]
            if self.dry_run:
                from devices.ocs.fake import FakeSwitch

                self._switches[name] = FakeSwitch(resource)
            else:
                self._switches[name] = open_switch(resource)
                self.stack.callback(self._switches[name].close)
        return self._switches[name]

    def transport(self, host: str):
        """The host's one SSH connection in this run (preflight, GPU view): its session's, or one that the
        session adopts when it opens."""
        if host in self._sessions:
            return self._sessions[host].transport
        if host not in self._transports:
            from devices.ssh import SshTransport

            self._transports[host] = SshTransport(self.inventory.hosts[host])
            self.stack.callback(self._transports[host].close)
        return self._transports[host]

    def session(self, host: str):
        """The host's SSH session with its agent and clock tracker (harness.bench.hosts)."""
        if host not in self._sessions:
            from harness.bench.hosts import HostSession

            session = HostSession(self.inventory.hosts[host], transport=self._transports.pop(host, None))
            self.stack.callback(session.close)
            session.open()
            self._sessions[host] = session
        return self._sessions[host]

    def open_sessions(self, hosts, workers: int = 32) -> dict[str, Any]:
        """The sessions of `hosts`, those not yet open opened in parallel (a bounded pool: set-up costs
        about the slowest host, not the sum); the first failure is raised once every attempt has ended."""
        from concurrent.futures import ThreadPoolExecutor

        from harness.bench.hosts import HostSession

        todo = [h for h in dict.fromkeys(hosts) if h not in self._sessions]

        adopted = {h: self._transports.pop(h) for h in todo if h in self._transports}

        def open_one(host):
            session = HostSession(self.inventory.hosts[host], transport=adopted.get(host))
            try:
                session.open()
            except BaseException:
                session.close()
                raise
            return session

        if todo:
            with ThreadPoolExecutor(max_workers=min(workers, len(todo)), thread_name_prefix="open") as pool:
                futures = {h: pool.submit(open_one, h) for h in todo}
            errors = []
            for host, future in futures.items():
                if future.exception() is not None:
                    errors.append(future.exception())
                    continue
                self.stack.callback(future.result().close)
                self._sessions[host] = future.result()
            if errors:
                raise errors[0]
        return {h: self._sessions[h] for h in hosts}

    def clock_tables(self) -> list[dict]:
        """The clock model of every host session this run opened (for the manifest), with how its probes'
        replies were dated (`SshTransport.receive_stamps`)."""
        tables = []
        for s in self._sessions.values():
            if s.clock is not None:
                stamps = getattr(s.transport, "receive_stamps", None)
                sources = s.clock_source_table() if hasattr(s, "clock_source_table") else {}
                tables.append({**s.clock.table(), **({"reply_stamps": stamps()} if stamps is not None else {}),
                               **({"sources": sources} if sources else {})})
        return tables

    def sessions(self) -> dict[str, Any]:
        return self.open_sessions(list(self.inventory.hosts))

    def record(self, events: list[Event], encoded: list | None = None) -> None:
        self.log.extend(events, encoded)

    def say(self, text: str) -> None:
        logs.echo(text, quiet=self.quiet)  # console.log keeps it in quiet mode too


def resolve_bench(spec: str, seed: int, stack: contextlib.ExitStack, workdir: Path, inventory: Bench | None = None):
    """'emulated:PROFILE[?ocs=PROTOCOL]', 'emulated-netns:PROFILE[?ocs=...]', 'emulated-sshd:PROFILE[?ocs=...]'
    (hosts: real sshd in the namespaces) or an inventory path →
    (Bench, EmulatedBench|None). `inventory`: the spec's inventory, already parsed (a run parses it once)."""
    emulated_bench = emulated_spec(spec)
    if emulated_bench:
        kind, profile, protocol = emulated_bench
        from devices.emulated.bench import EmulatedBench

        prof = load_profile(profile)
        netns = None
        if kind in NETNS_KINDS:
            if os.geteuid() != 0:
                raise InputError(f"--bench {kind} needs root (network namespaces)")
            if kind == "emulated-sshd":
                from devices.emulated.sshd_hosts import sshd_missing

                if reason := sshd_missing():
                    raise InputError(f"--bench emulated-sshd: {reason}")
            netns = f"hil{os.getpid() % 100000}"
            # Real processes in the namespaces read the real clock: no emulated offset or drift there.
            prof = dataclasses.replace(prof, clock_offset_ms=(0.0, 0.0), drift_ppm=(0.0, 0.0))
        emulated = EmulatedBench(prof, seed=seed, protocol=protocol, workdir=workdir / "bench",
                                 netns_prefix=netns, sshd=kind == "emulated-sshd")
        stack.callback(emulated.stop)
        emulated.start()
        return load_inventory(emulated.inventory_path), emulated
    if inventory is not None:
        return inventory, None
    path = Path(spec)
    if not path.exists():
        raise InputError(f"--bench: no such inventory file, and not one of {', '.join(BENCH_KINDS)}", spec)
    return load_inventory(path), None


def memory_handed_back() -> None:
    """Freed memory goes back to the system: a campaign's end reads its blocks of cycles one after another, and what
    one block took must not stay with the process. Arrow's default pool (mimalloc) kept what it once held (~150 MiB
    at 10^4 cycles with ~30 MiB in use): the system allocator instead — here for pyarrow's own calls; Arrow's C++
    default, which its Parquet readers and datasets take, is fixed at its first allocation, so the CLI chooses it
    (`harness.cli.main`). glibc's malloc raises its mmap threshold as large blocks are freed, then serves them from
    a heap it cannot shrink (~+70 MiB): a fixed threshold instead."""
    import ctypes

    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its own policy
        ctypes.CDLL(None).mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD: arrays of 128 KiB and more are mapped


def run(options: RunOptions) -> int:
    """Validate every input, then take the run directory (new, or the resumed one), its lock and the bench
    lease, then run. Nothing is created for input that fails validation; a dry run writes nothing."""
    from harness.lock import RunDirLock, RunDirLocked

    memory_handed_back()
    resumed = None
    if options.resume:
        if options.dry_run:
            raise InputError("--dry-run with --resume: a dry run touches no run")
        resumed = resume.plan_resume(Path(options.resume), playbook_path=options.playbook, bench=options.bench,
                                     cycles=options.cycles, seed=options.seed)
        playbook, ident, source = resumed.playbook, resumed.identity, resumed.bench
    else:
        if not options.playbook:
            raise InputError("harness run: a PLAYBOOK is required (or --resume RUN_DIR)")
        playbook = load_playbook(options.playbook)
        cycles = playbook.cycles if options.cycles is None else options.cycles
        if not 1 <= cycles <= MAX_CYCLES:  # the plan is built whole: 10**20 cycles would exhaust memory
            raise InputError(f"--cycles: expected 1..{MAX_CYCLES}, found {cycles}")
        seed = playbook.seed if options.seed is None else options.seed
        if not 0 <= seed < 2**63:
            raise InputError(f"--seed: expected 0..2**63-1, found {seed}")
        source = resume.read_bench(options.bench or playbook.bench)  # the inventory parsed here, once
        ident = resume.identity(playbook, source, cycles, seed)
    with contextlib.ExitStack() as held:
        if resumed:
            run_dir = resumed.run_dir
        elif options.dry_run:
            import tempfile

            run_dir = Path(held.enter_context(tempfile.TemporaryDirectory(prefix="harness-dry-run-")))
        else:
            run_dir = _new_run_dir(options.out, playbook.name)
        try:
            if not options.dry_run:
                try:
                    held.callback(RunDirLock(run_dir).acquire(run_dir.name).release)
                except RunDirLocked as exc:
                    raise InputError(f"run directory in use: {exc}") from None
                held.enter_context(logs.run_logs(run_dir))  # console.log, wire.log
            # A lease on every OCS of an inventory, real or an external emulated bench (`emulated: true`, as
            # `harness emulate` writes: shared like a real one). A run's own emulator and dry runs need none.
            lease = recovery = None
            if source.inventory is not None and not options.dry_run:
                lease = _acquire_lease(source.inventory, source.spec, run_dir.name)
                held.callback(lease.release)
                recovery = _take_over_recovery(source.inventory, run_dir, options)
            if not resumed and not options.dry_run:
                resume.keep_inputs(run_dir, playbook, source)
        except BaseException as exc:
            if not resumed and not options.dry_run:  # setup failed: leave no directory behind
                import shutil

                shutil.rmtree(run_dir, ignore_errors=True)
            if isinstance(exc, OSError):  # e.g. a disk full before the start: one line, not a traceback
                raise InputError(f"cannot write the run record: {exc.strerror or exc}", str(run_dir)) from None
            raise
        try:
            return _run(options, playbook, ident, source, run_dir, resumed.manifest if resumed else None, lease,
                        recovery)
        except InputError:
            log = run_dir / "events.jsonl"
            if not resumed and not options.dry_run and not (log.exists() and log.stat().st_size):
                import shutil  # a step refused its input before anything was measured: no run happened

                shutil.rmtree(run_dir, ignore_errors=True)
            raise


def _new_run_dir(out: str | None, name: str) -> Path:
    """`--out DIR` is the run directory itself (new or empty); by default runs/<UTC time>-<playbook>."""
    if out is None:
        return rec.new_run_dir("runs", name)
    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InputError("--out: exists and is not an empty directory (use --resume RUN_DIR to continue a run)",
                         out)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _take_over_recovery(bench: Bench, run_dir: Path, options: RunOptions):
    """Under the lease, before anything is snapshotted: refuse a switch another run left changed (unless
    the lab adopts its state), then note that this run owns the switches' recovery (harness.recovery)."""
    from harness import recovery

    adopted = recovery.check_pending(bench, run_dir, adopt=options.adopt_current_state, warn=_error_line)
    recovery.mark_pending(bench, run_dir, run_dir.name)
    return bench, adopted


def _run(options: RunOptions, playbook: Playbook, ident, source, run_dir: Path, previous_manifest: dict | None,
         lease, recovery=None) -> int:
    seed, cycles, bench_spec = ident.seed, ident.cycles, ident.bench
    resume_after = _logged_cycles(run_dir, playbook) if previous_manifest else {}
    run_id = run_dir.name

    previous = _install_signal_handlers()
    status = "error"
    signame = ""
    with contextlib.ExitStack() as stack:
        stack.callback(_restore_signal_handlers, previous)
        try:
            log = EventLog(run_dir / "events.jsonl")
        except OSError as exc:
            raise InputError(f"cannot write the run record: {exc.strerror or exc}", str(run_dir)) from None
        stack.callback(log.close)
        bench, emulated = resolve_bench(bench_spec, seed, stack, run_dir, inventory=source.inventory)
        logs.hide_secrets(bench)  # before any device is opened
        ctx = RunContext(playbook=playbook, inventory=bench, run_dir=run_dir, run_id=run_id, seed=seed,
                         cycles=cycles, log=log, stack=stack, emulated=emulated, dry_run=options.dry_run,
                         quiet=options.quiet, resume_after=resume_after, lease=lease)
        ctx.bench = LiveBench(ctx, emulated)
        if recovery is not None and recovery[1]:
            ctx.manifest_extra["adopted_state"] = recovery[1]
        if options.adopt_current_state:  # also for a unit found by its identity (harness.bench.circuits)
            ctx.manifest_extra["adopt_current_state"] = True
        inventory_text = None if emulated else source.data  # the bytes the run's identity hashed
        manifest = rec.build_manifest(playbook, inventory_text=inventory_text, seed=seed,
                                      profile=_profile_record(emulated.profile) if emulated else None,
                                      extra={"run_id": run_id, "bench": bench_spec, "cycles": cycles})
        manifest["run"] = resume.identity_record(ident)
        if previous_manifest:
            manifest = previous_manifest
            manifest.setdefault("extra", {}).setdefault("resumed", []).append(
                {"after_cycles": resume_after, "utc": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        rec.write_json_atomic(run_dir / "manifest.json", manifest)
        ctx.say(f"[bold]{playbook.name}[/] on {bench.name} → " + ("dry run: nothing is written" if options.dry_run else str(run_dir)))
        started = time.monotonic()
        started_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
        try:
            if not options.dry_run:  # the quick preflight (harness bench check --quick) before any switch is touched
                _preflight(ctx)
            for step in playbook.steps:
                if ctx.lease is not None and ctx.lease.lost:
                    ctx.latch_broken(f"bench lock lost: {ctx.lease.lost}")
                if ctx.broken:
                    ctx.results[step.name] = StepOutcome.skipped(ctx.broken)
                    continue
                impl = _step_impl(step.type)
                ctx.say(f"step [cyan]{step.name}[/] ({step.type})")
                ctx.results[step.name] = impl(ctx, step)
            status = "broken" if ctx.broken else "ok" if all(r.ok for r in ctx.results.values()) else "failed"
            if ctx.broken:
                ctx.manifest_extra["broken"] = ctx.broken
        except (DeviceError, OSError) as exc:
            status = "error"
            _error_line(f"run stopped: {exc}")
            ctx.manifest_extra["error"] = str(exc)
        except KeyboardInterrupt:
            status, signame = "aborted", "SIGINT"
            ctx.say("[yellow]run aborted; restoring the bench[/]")
        except Aborted as exc:
            status, signame = "aborted", exc.signame
            ctx.say("[yellow]run aborted; restoring the bench[/]")
        finally:
            try:
                ctx.teardown.close()  # restore the bench before the record is written (and on abort)
            except (KeyboardInterrupt, Aborted):
                ctx.teardown.close()  # a second signal must not skip the restore
            try:
                log.flush()
            except OSError:
                pass  # already reported: the log failed during the run
            wall = time.monotonic() - started
        if ctx.manifest_extra.get("restore_error"):
            for ocs, why in ctx.manifest_extra["restore_error"].items():
                _error_line(f"{ocs}: bench NOT restored: {why}")
        _stop_signals.recording = True
        if not options.dry_run:
            ctx.manifest_extra["devices"] = _device_identity(ctx)
        if recovery is not None:  # the switches this run restored (or never moved) need no recovery
            from harness.recovery import clear_pending

            clear_pending(recovery[0], run_dir, ctx.manifest_extra.get("restored"))
        ctx.manifest_extra["signal"] = signame or None
        if _stop_signals.later:
            ctx.manifest_extra["signals_while_stopping"] = list(_stop_signals.later)
        # The bench is still up here (the stack unwinds after), so ground truth is complete.
        try:
            record = finish_run(ctx, manifest, status=status, wall_s=wall, started_utc=started_utc)
            if options.junit:
                from harness.junit import write_junit

                write_junit(run_dir, Path(options.junit))
            console_summary(ctx, record)  # quiet: into console.log only
        except OSError as exc:  # e.g. the disk filled up: the JSONL log is still the record
            _error_line(f"cannot write the run record in {run_dir}: {exc}")
            status = "error"
    ctx.say(f"done: {status} in {wall:.1f} s" + ("" if options.dry_run else f" — {run_dir}"))
    code = 128 + getattr(signal, signame or "SIGINT") if status == "aborted" else \
        {"ok": 0, "failed": 1, "broken": 1}.get(status, 1)
    if options.json:
        checks = [{"step": n, **c} for n, r in ctx.results.items() for c in r.checks]
        print(json.dumps(rec.to_jsonable({"run_dir": None if options.dry_run else str(run_dir), "status": status,
                                          "exit_code": code, "checks": checks})), flush=True)
    return code


def _device_identity(ctx) -> dict | None:
    """Who the devices say they are (harness.identity); a device that cannot tell never fails the run."""
    from harness.identity import device_identity

    try:
        # a switch that could not be restored stopped answering: asking it who it is would only wait out a timeout
        return device_identity(ctx._switches, ctx._sessions, ctx.inventory.nic_ports,
                               not_asked=ctx.manifest_extra.get("restore_error"))
    except Exception as exc:  # evidence, not a requirement
        return {"error": str(exc)[:300]}


def _preflight(ctx) -> None:
    """Over the run's own switch drivers and SSH connections: the steps reuse them (no extra connection)."""
    from harness.preflight import PreflightFailed, quick_check

    problems = quick_check(ctx.inventory, switch_of=ctx.switch, transport_of=ctx.transport)
    if problems:
        raise PreflightFailed(f"preflight: {problems[0]}" + (f" (+{len(problems) - 1} more: harness bench check)"
                                                             if len(problems) > 1 else ""))
    _preflight_stages(ctx)


def _preflight_stages(ctx) -> None:
    """One line per host: the stages its agent will observe and why not the others. A stage a step asked for
    that the lab could give (a tool, a privilege) stops the run; one the module cannot report is said on the
    console and in summary.md. Never silent."""
    from analysis.stages import STAGES_DOWN
    from harness.preflight import ETHTOOL_STAGES, PreflightFailed, stage_report

    observing = [step.params for step in ctx.playbook.steps if "ethtool_interval_us" in step.params]
    if not observing:
        return
    asked = {"phy_up", "port_active", *STAGES_DOWN, *ETHTOOL_STAGES}
    probes = any(p.get("probes") for p in observing)
    if probes:
        asked.add("first_packet")
    reports = stage_report(ctx.inventory, ctx.transport, probes=probes)
    stops = [r.line() for r in reports if any(fixable and stage in asked for stage, (_, fixable) in r.lost.items())]
    if not ctx.quiet or stops:
        for r in reports:
            print(f"preflight: {r.line()}", file=sys.stderr)
    if stops:
        raise PreflightFailed(f"preflight: {stops[0]}" + (f" (+{len(stops) - 1} more hosts)" if len(stops) > 1 else "")
                              + " — declare the tool's path (tools:) or the privilege (become: sudo) in the inventory")
    unobserved = [r.line() for r in reports if any(stage in asked for stage in r.lost)]
    if unobserved:
        ctx.manifest_extra["unobserved_stages"] = unobserved
        if ctx.quiet:
            for line in unobserved:
                print(f"preflight: {line}", file=sys.stderr)


_error_line = logs.error_line


def _acquire_lease(bench: Bench, where: str, run_id: str):
    """The lease on every OCS of `bench` (read from `where`, named in the refusal), or InputError naming who
    holds it."""
    from harness.lock import BenchLease, BenchLocked, lease_ttl, ocs_lease_keys

    try:
        lease = BenchLease([k for r in bench.ocs.values() for k in ocs_lease_keys(r)], run_id=run_id,
                           ttl_s=lease_ttl())
        return lease.acquire()
    except BenchLocked as exc:
        raise InputError(f"bench is locked: {exc}", where) from None
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _logged_cycles(run_dir: Path, playbook: Playbook) -> dict[str, int]:
    """Where each resumable step continues: its `resume_point` given the last complete cycle in the log. Each cycle is written and fsynced whole, so only a log whose
    tail was torn by a crash can hold a partial cycle: its lines move to events.incomplete.jsonl (kept,
    not lost) and that cycle is measured again."""
    log_path = run_dir / "events.jsonl"
    raw = log_path.read_bytes() if log_path.exists() else b""
    last = 0
    if raw:
        lines = raw.split(b"\n")
        torn = lines.pop() != b""  # text after the final newline was being written when the run died
        cycles = [json.loads(line).get("cycle", 0) for line in lines]
        last = max(cycles, default=0)
        if torn:
            keep = [ln for ln, c in zip(lines, cycles) if c != last]
            partial = [ln for ln, c in zip(lines, cycles) if c == last] + [raw.rsplit(b"\n", 1)[-1]]
            with open(run_dir / "events.incomplete.jsonl", "ab") as f:
                f.write(b"\n".join(partial) + b"\n")
            rec.write_text_atomic(log_path, b"".join(ln + b"\n" for ln in keep).decode())
            last -= 1
    return {s.name: STEP_TYPES[s.type].resume_point(run_dir, s, max(0, last)) for s in playbook.steps
            if STEP_TYPES[s.type].resume_point is not None}


def _profile_record(profile) -> dict:
    from devices.emulated.profile import PROFILE_DIR

    builtin = profile.path and Path(profile.path).resolve().parent == PROFILE_DIR
    return {"name": profile.name, "path": None if builtin else profile.path, "source": profile.source,
            "copies": getattr(profile, "copies", None),
            "ocs": {k: d.spec for k, d in profile.ocs.items()}, "nic": {k: d.spec for k, d in profile.nic.items()},
            "clock_offset_ms": list(profile.clock_offset_ms), "drift_ppm": list(profile.drift_ppm)}


def _step_impl(step_type: str):
    spec = STEP_TYPES[step_type]
    if spec.impl is None:
        raise InputError(f"step type {step_type!r} is declared but has no implementation")
    return spec.impl


class _StopSignals:
    """The first SIGTERM (Aborted) or SIGINT (KeyboardInterrupt) stops the run; any later one is noted and
    otherwise ignored, so that no sequence of signals can cut the bounded restore, its verification or the
    writing of the run record short (`harness run` still ends within the teardown bound)."""

    def __init__(self):
        self.first: str | None = None
        self.later: list[str] = []
        self.recording = False  # the bench is restored and the record is being written: nothing may stop it

    def __call__(self, signum, frame):
        name = signal.Signals(signum).name
        if self.first is None and not self.recording:
            self.first = name
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Aborted(name)
        self.later.append(name)
        print(f"harness: {name} again: already stopping (restoring the bench, writing the record)",
              file=sys.stderr)


_stop_signals = _StopSignals()


def _install_signal_handlers():
    global _stop_signals
    _stop_signals = _StopSignals()
    try:
        return {s: signal.signal(s, _stop_signals) for s in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread (e.g. called from a test thread)
        return None


def _restore_signal_handlers(previous) -> None:
    for signum, handler in (previous or {}).items():
        signal.signal(signum, handler)
