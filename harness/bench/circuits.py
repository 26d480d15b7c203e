"""Guarded circuits: every step that moves an OCS's cross-connects does it through one CircuitGuard.

The guard snapshots the switch once per run (kept in `restore.json`, so a resumed run restores what the
interrupted run found), applies mappings with bounded retries, backoff and reconnects (the driver says
which refusals are permanent), and at the end of the run — success, error, SIGINT, SIGTERM — restores the
snapshot on exactly the ports it touched, within a time bound, and verifies it by reading the switch back.
"""
from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from devices.errors import DeviceDenied, DeviceError, DeviceTimeout, PortNotAllowed, TransportClosed
from devices.ocs.base import StateMismatch
from devices.protocols import CircuitSwitch, Pending
from devices.timing import CommandTiming, Deadline, now_ns
from harness.bench import BenchBroken
from harness.bench.stages import OcsStamps


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3  # retries after the first attempt
    backoff_s: float = 0.1  # first backoff; doubles per retry
    timeout_s: float = 10.0  # deadline of one OCS command


@dataclass(frozen=True)
class Applied:
    """One guarded apply: the driver's timing, when the command was sent (the driver's first change written;
    after retries, the first attempt's write, or its start if it failed before writing), the transient faults
    met (one cause per retry)."""

    timing: CommandTiming
    first_sent_ns: int
    causes: tuple[str, ...] = ()
    written: bool = False  # first_sent_ns is the first attempt's write (else, after retries, its start)

    @property
    def ocs_stamps(self) -> OcsStamps:
        """The bounds and provenance of the `ocs_command_sent` / `_completed` events. After retries the first
        change went out somewhere between the first attempt's write (or start) and the last attempt's write."""
        sent = self.timing.sent_stamp or "unbounded"
        if self.causes:
            sent = f"first attempt's {'write' if self.written else 'start'}, {len(self.causes)} retries"
        bound = max(self.timing.sent_bound_ns,
                    self.timing.sent_ns + self.timing.sent_bound_ns - self.first_sent_ns)
        return OcsStamps(bound, self.timing.completed_bound_ns, f"harness:{sent}",
                         f"harness:{self.timing.completed_stamp or 'unbounded'}")


@dataclass
class RestoreOutcome:
    restored: bool = False
    error: str | None = None
    interrupted: bool = False


class CircuitGuard:
    def __init__(self, name: str, switch: CircuitSwitch, *, snapshot_path: Path | None, resuming: bool,
                 teardown_s: float = 15.0, events_path: Path | None = None, allowed: frozenset[int] = frozenset(),
                 lease=None, on_broken: Callable[[str], None] | None = None):
        """allowed: the inventory's allowlist of this OCS (what an exclusive apply may clear). lease: the run's
        bench lease (its `lost` says why it is no longer ours); once lost, every apply but the restore is
        refused, whichever step asks. on_broken(why): told of every BenchBroken the guard raises, so the run
        latches broken whatever the step does with the exception."""
        self.name, self.switch, self.teardown_s, self.allowed = name, switch, teardown_s, frozenset(allowed)
        self.lease, self.on_broken = lease, on_broken
        self.suspect = False  # the session timed out or dropped: reconnect before the next use
        self._replies: ThreadPoolExecutor | None = None  # the one thread that awaits replies (`finish_later`)
        self.touched: set[int] = set()
        self.events_path = events_path  # where the switch's own messages go (ocs_events.jsonl)
        self.events_recorded = 0
        try:
            self.snapshot = self._snapshot(snapshot_path, resuming)
        finally:
            self.record_events()

    def record_events(self) -> int:
        """Append what the switch said on its own (alarms, REPT EVT, its error queue at connect) to
        `events_path`, one JSON line each with its harness time, fsynced: evidence about the bench."""
        try:
            events = self.switch.take_events()
        except DeviceError:
            return 0
        if events and self.events_path is not None:
            with open(self.events_path, "a", encoding="utf-8") as out:
                for event in events:
                    out.write(json.dumps({"ocs": self.name, **asdict(event)}, separators=(",", ":")) + "\n")
                out.flush()
                os.fsync(out.fileno())
        self.events_recorded += len(events)
        return len(events)

    def _snapshot(self, path: Path | None, resuming: bool) -> dict[int, int]:
        """The cross-connects found at start, or — when resuming — those the interrupted run found (the
        switch now shows that run's last cycle)."""
        saved = json.loads(path.read_text()) if path is not None and path.exists() else {}
        if resuming and self.name in saved:
            return {int(i): int(e) for i, e in saved[self.name].items()}
        original = self.switch.patches()
        if path is not None:
            from harness.record import write_text_atomic

            saved[self.name] = {str(i): e for i, e in sorted(original.items())}
            write_text_atomic(path, json.dumps(saved, indent=1) + "\n")
        return original

    def broken(self, why: str, causes: list[str] | None = None) -> BenchBroken:
        """The BenchBroken to raise, the run told first."""
        if self.on_broken is not None:
            self.on_broken(why)
        return BenchBroken(why, causes)

    def check_lease(self) -> None:
        """Refuse to change the switch once the bench lease is lost (another run may drive it now)."""
        if self.lease is not None and self.lease.lost:
            raise self.broken(f"bench lock lost: {self.lease.lost}")

    def _touch(self, mapping: Mapping[int, int], exclusive: bool) -> None:
        self.touched |= {p for pair in mapping.items() for p in pair}
        if exclusive:  # an exclusive apply drops every other patch whose ingress is allowed
            self.touched |= {p for i, e in self.snapshot.items() if i in self.allowed for p in (i, e)}

    def plan_ahead(self, mapping: Mapping[int, int], *, exclusive: bool = True) -> None:
        """Let the driver plan the next `apply` of `mapping` while the switch settles the last one
        (devices.ocs.base.plan_ahead: nothing is sent; a driver without a kept state plans at `apply`)."""
        from devices.ocs.base import plan_ahead

        plan_ahead(self.switch, mapping, exclusive)

    def apply(self, mapping: Mapping[int, int], policy: RetryPolicy = RetryPolicy(), *, exclusive: bool = True,
              deadline: Deadline | None = None, restoring: bool = False) -> Applied:
        """`switch.apply` with bounded retries and exponential backoff for transient faults (a refusal the
        driver does not call permanent, a timeout, a dropped connection, a garbled reply); reconnects after
        a timeout or a drop. `apply` reconciles from `patches()`, so a retry after a lost reply does not
        repeat the change. Raises BenchBroken when the retries run out, the refusal is permanent or the bench
        lease is lost (`restoring`: the restore itself, which runs whatever happened); PortNotAllowed as is
        (nothing was sent)."""
        return self.begin(mapping, policy, exclusive=exclusive, deadline=deadline, restoring=restoring).finish()

    def begin(self, mapping: Mapping[int, int], policy: RetryPolicy = RetryPolicy(), *, exclusive: bool = True,
              deadline: Deadline | None = None, restoring: bool = False) -> "GuardedApply":
        """`apply` up to its first attempt's write (`CircuitSwitch.begin_apply`): `finish()` awaits the reply and
        makes the retries, on one thread, exactly once. PortNotAllowed as is (nothing was sent)."""
        if not restoring:
            self.check_lease()
        self._touch(mapping, exclusive)
        self.switch.timeout_s = policy.timeout_s
        return GuardedApply(self, mapping, policy, exclusive, deadline, restoring)

    def finish_later(self, command: "GuardedApply", on_done: Callable[[], None],
                     then: Callable[[], None] | None = None) -> Future:
        """`command.finish()` on the guard's reply thread, then `then()` there (the driver is the thread's until
        both end); `on_done()` once the Future of its Applied is done. The caller does other work meanwhile
        and touches the switch only after that."""
        if self._replies is None:
            self._replies = ThreadPoolExecutor(1, thread_name_prefix=f"ocs-replies-{self.name}")

        def finish() -> Applied:
            applied = command.finish()
            if then is not None:
                then()
            return applied

        future = self._replies.submit(finish)
        future.add_done_callback(lambda _: on_done())
        return future

    def close(self) -> None:
        """Stop the reply thread once its work ends (bounded by that command's own deadline)."""
        if self._replies is not None:
            self._replies.shutdown(wait=False)
            self._replies = None

    def _on_touched(self, patches: Mapping[int, int]) -> dict[int, int]:
        return {i: e for i, e in patches.items() if i in self.touched or e in self.touched}

    def verify(self, now: Mapping[int, int]) -> bool:
        """Whether `now` shows the snapshot on every touched port (and nothing else there)."""
        return self._on_touched(now) == self._on_touched(self.snapshot)

    def restore(self, within_s: float | None = None) -> RestoreOutcome:
        """Put the snapshot back on the touched ports and verify with `patches()` — within `within_s`,
        whatever state the switch session is in. Never raises: the outcome says what happened."""
        within_s = self.teardown_s if within_s is None else within_s
        outcome = RestoreOutcome()
        if not self.touched:
            outcome.restored = True
            return outcome
        deadline = Deadline(within_s)

        def work():
            try:
                if self.suspect:
                    self.switch.reconnect()
                    self.suspect = False
                target = self._on_touched(self.snapshot)
                self.apply(target, RetryPolicy(retries=3, backoff_s=0.1, timeout_s=min(10.0, within_s)),
                           exclusive=False, deadline=deadline, restoring=True)
                lingering = [i for i, e in self._on_touched(self.switch.patches()).items() if target.get(i) != e]
                if lingering:  # patches the run made that the snapshot did not have
                    self.switch.disconnect(lingering)
            except Exception as exc:  # report, never mask the original error
                outcome.error = str(exc)
            try:  # verify what the switch reports, whether or not the apply went through
                outcome.restored = self.verify(self.switch.patches())
                if outcome.restored:
                    outcome.error = None
            except Exception as exc:
                outcome.error = outcome.error or str(exc)
            self.record_events()

        worker = threading.Thread(target=work, daemon=True, name=f"restore-{self.name}")
        worker.start()
        while worker.is_alive() and not deadline.expired():
            try:
                worker.join(min(0.1, deadline.remaining() or 0.1))
            except (KeyboardInterrupt, Exception):  # another signal: the restore is bounded, let it finish
                outcome.interrupted = True
        if worker.is_alive():
            outcome.error = outcome.error or f"restore did not finish within {within_s} s"
        return outcome


class GuardedApply:
    """One guarded apply under way (`CircuitGuard.begin`): its first attempt is written, or failed."""

    def __init__(self, guard: CircuitGuard, mapping: Mapping[int, int], policy: RetryPolicy, exclusive: bool,
                 deadline: Deadline | None, restoring: bool = False):
        self.guard, self.mapping, self.policy, self.exclusive, self.deadline = guard, mapping, policy, exclusive, \
            deadline
        self.restoring = restoring
        self.causes: list[str] = []
        self.first_start = now_ns()
        self._pending = self._attempt()
        # The change went out at the first attempt's write, whatever the retries after it (one may have sent it
        # unanswered): known now where the driver writes before it waits; 0 if that attempt failed before.
        self.sent_ns = max(self.first_start, self._pending.sent_ns) if self._pending is not None and \
            self._pending.sent_ns else 0

    def _attempt(self) -> Pending | None:
        """One attempt up to its write; None if it failed (its cause noted)."""
        guard = self.guard
        try:
            if guard.suspect:
                guard.switch.reconnect()
                guard.suspect = False
            return guard.switch.begin_apply(self.mapping, exclusive=self.exclusive)
        except PortNotAllowed:
            raise
        except DeviceError as exc:
            self._failed(exc)
            return None

    def _failed(self, exc: DeviceError) -> None:
        guard = self.guard
        if isinstance(exc, DeviceDenied):
            if exc.permanent:
                raise guard.broken(f"ocs {guard.name}: {exc}", self.causes) from exc
            # a pipelined command refused too is named with it: one cause per attempt, every refusal seen
            self.causes.append(f"ocs-retry:{guard.name}: denied {exc.code}"
                               + (f" (then {', '.join(exc.after)})" if exc.after else ""))
        elif isinstance(exc, StateMismatch):  # the session is fine; the driver's next apply plans from a read
            self.causes.append(f"ocs-retry:{guard.name}: {str(exc)[:120]}")
        elif isinstance(exc, (DeviceTimeout, TransportClosed)):
            guard.suspect = True
            self.causes.append(f"ocs-retry:{guard.name}: "
                               f"{'timeout' if isinstance(exc, DeviceTimeout) else 'connection lost'}")
        else:  # e.g. a garbled reply that parsed as something else
            guard.suspect = True
            self.causes.append(f"ocs-retry:{guard.name}: {str(exc)[:120]}")

    def finish(self) -> Applied:
        """The reply of the attempt under way, then the retries. Raises BenchBroken when they run out or a
        refusal is permanent."""
        policy, pending, self._pending = self.policy, self._pending, None
        for attempt in range(policy.retries + 1):
            if attempt:
                wait = policy.backoff_s * 2 ** (attempt - 1)
                if self.deadline is not None and (self.deadline.remaining() or 0) < wait:
                    break
                time.sleep(wait)
                if not self.restoring:  # a retry is a new change: not once the lease is lost
                    self.guard.check_lease()
                pending = self._attempt()
            if pending is None:
                continue
            try:
                timing = pending.finish()
            except PortNotAllowed:
                raise
            except DeviceError as exc:
                self._failed(exc)
                continue
            # The command went out at the driver's write of its first change, after the driver read the
            # switch's state to plan it (a round trip: milliseconds on a loaded machine, more on a real unit).
            # After a retry whose first attempt failed before its write, that attempt's start stands.
            first = self.sent_ns or (self.first_start if self.causes else max(self.first_start, timing.sent_ns))
            applied = Applied(timing, first, tuple(self.causes), written=bool(self.sent_ns))
            self.guard.record_events()
            return applied
        raise self.guard.broken(f"ocs {self.guard.name}: gave up after {len(self.causes)} attempts "
                          f"({self.causes[-1] if self.causes else 'no time left'})", self.causes)


def guard(ctx, name: str, *, teardown_s: float = 15.0) -> CircuitGuard:
    """The run's guard of OCS `name`: created on first use, its restore registered on the run's teardown
    (before connections close); the manifest records `restored` / `restore_error` per OCS."""
    guards = ctx.guards
    if name not in guards:
        switch = ctx.switch(name)
        if getattr(ctx, "lease", None) is not None and not ctx.dry_run:
            _claim_identity(ctx, name, switch)
        path = None if ctx.dry_run else Path(ctx.run_dir) / "restore.json"
        g = CircuitGuard(name, switch, snapshot_path=path, resuming=bool(ctx.resume_after), teardown_s=teardown_s,
                         events_path=None if ctx.dry_run else Path(ctx.run_dir) / "ocs_events.jsonl",
                         allowed=ctx.inventory.ocs[name].allowed_ports, lease=ctx.lease, on_broken=ctx.latch_broken)
        guards[name] = g

        def restore():
            g.close()
            outcome = g.restore()
            ctx.manifest_extra.setdefault("ocs_events", {})[name] = g.events_recorded
            ctx.manifest_extra.setdefault("restored", {})[name] = outcome.restored
            if outcome.error:
                ctx.manifest_extra.setdefault("restore_error", {})[name] = outcome.error

        if not ctx.dry_run:
            ctx.teardown.callback(restore)
    return guards[name]



def _claim_identity(ctx, name: str, switch: CircuitSwitch) -> None:
    """Before the snapshot: lease the switch by its own identity too (its serial, where its answer has one),
    and refuse a unit another run left changed under another address (harness.recovery.claim_identity)."""
    from harness import recovery
    from harness.lock import BenchLocked, ocs_identity_key

    try:
        key = ocs_identity_key(ctx.inventory.ocs[name].protocol, switch.identify())
    except DeviceError:
        return  # it cannot tell: its endpoints' lease stands alone
    if key is None:
        return
    try:
        ctx.lease.add(key)
    except BenchLocked as exc:
        raise BenchBroken(f"ocs {name}: the same switch is in use under another address: {exc}") from None
    refusal = recovery.claim_identity(key, name, Path(ctx.run_dir), ctx.run_id,
                                      adopt=bool(ctx.manifest_extra.get("adopt_current_state")))
    if refusal:
        raise BenchBroken(refusal)
