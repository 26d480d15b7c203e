"""Circuits applied *and* links trained — the one way a step waits for links (`ctx.bench.links.wire`), after
labgrid's `Strategy.transition` with its `never_retry` latch: a wiring that failed (the switch command, the
lease, a host's watch) leaves the bench in a state nobody knows, so every later wiring of the run is refused at
once with that first cause instead of trying again over it.

A link is trained when the hosts' watch reports its carrier and its RDMA port ACTIVE *after* the command went
out: read from the run's one observation log with `expect`, as the turnaround cycle reads its stages, so a
timeout says what did arrive per port (the stages seen and the last value of each watched field)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from devices.errors import DeviceError
from devices.timing import Deadline, now_ns
from harness.bench.observe import CycleWatch

if TYPE_CHECKING:
    from harness.bench.circuits import Applied, RetryPolicy
    from harness.bench.stages import Arrivals

TRAINED = {"phy_up", "port_active"}  # carrier up, RDMA port ACTIVE (the second implies the first)
WATCH_READY_S = 15.0  # how long a new watch may take to print its current values


class WiringRefused(DeviceError):
    """An earlier wiring of this run failed: no further wiring is tried (labgrid's never_retry)."""


@dataclass(frozen=True)
class Wired:
    """One wiring: the switch's apply, whether every awaited port trained by the deadline, and — when not — what
    arrived per port still waiting (`seen`); `seconds` from the command's send to the links up (or the timeout)."""

    applied: "Applied"
    up: bool
    seconds: float
    seen: str = ""
    arrivals: "Arrivals | None" = field(default=None, repr=False)


class LinkWatch(CycleWatch):
    """A cycle's watch over the two stages that say a link trained, keeping besides what each port's watch
    reported before the command (`before`: field -> its last value) and since, for a timeout's message."""

    def __init__(self, *args, before: dict[str, dict[str, str]], note=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.before, self.note = before, note  # note(obs): every line fed, also to the one who keeps the values
        self.since: dict[str, list[str]] = {key: [] for key in self.need}

    def feed(self, obs) -> None:
        key = self.port_of.get((obs.host, obs.netdev))
        if key is not None and obs.kind == "watch":
            self.since[key].append(f"{obs.field} {obs.value}")
        if self.note is not None:
            self.note(obs)
        super().feed(obs)

    def describe(self) -> str:
        parts = []
        for key, need in self.need.items():
            if need:
                seen = [s for s in self.chain if (key, s) in self.arrivals.kept]
                before = ", ".join(f"{f} {v}" for f, v in self.before.get(key, {}).items()) or "nothing"
                parts.append(f"{key}: saw {', '.join(seen) or 'nothing'}, missing {', '.join(sorted(need))} "
                             f"(its watch: before the command {before}; since "
                             f"{', '.join(self.since[key][-8:]) or 'no change'})")
        return "; ".join(parts)


class Links:
    """`ctx.bench.links`: wire circuits and wait until the links they move trained (see the module doc)."""

    def __init__(self, live):
        self._live = live
        self._failed: str | None = None  # the first failed wiring's cause: later ones are refused with it
        self._watched: set[tuple[str, str]] = set()  # (host, netdev) whose watch feeds the run's log
        self._values: dict[tuple[str, str], dict[str, str]] = {}  # (host, netdev) -> field -> last value drained

    def wire(self, ocs: str, mapping: Mapping[int, int], deadline: float | Deadline, *, ports=(),
             policy: "RetryPolicy | None" = None, watch_us: int = 1000) -> Wired:
        """Apply `mapping` on OCS `ocs` through the run's guard (lease, allowed ports, restore), then wait until
        every NIC port of `ports` (objects with key, host, netdev, rdma_dev, rdma_port) trained a new link, or
        `deadline` (seconds from the switch's reply, or a Deadline) passes: then `up` is False and `seen` says
        what arrived. The hosts' watches poll every `watch_us`. A failure raises, and latches: every later call
        raises WiringRefused with its cause."""
        if self._failed is not None:
            raise WiringRefused(f"wiring refused: an earlier wiring failed: {self._failed}")
        try:
            return self._wire(ocs, mapping, deadline, list(ports), policy, watch_us)
        except DeviceError as exc:  # BenchBroken among them
            self._failed = f"{exc}"[:300] or type(exc).__name__
            raise

    def _wire(self, ocs, mapping, deadline, ports, policy, watch_us) -> Wired:
        from harness.bench.circuits import RetryPolicy
        from harness.bench.hosts import HostGroup

        live = self._live
        guard = live.circuits(ocs)
        log = live.observe()
        group = None
        if ports:
            sessions = live.hosts.open(sorted({p.host for p in ports}))
            self._watch(sessions, ports, log, watch_us)
            group = HostGroup(sessions)  # a dropped host reconnected (or BenchBroken), host times converted
            # what the watches said before this command is not about its links (kept: a timeout's "before")
            log.drain(group.on_fault, self._note)
        applied = guard.apply(mapping, policy or RetryPolicy())
        if group is None:
            return Wired(applied, True, (now_ns() - applied.first_sent_ns) / 1e9)
        watch = LinkWatch({p.key: set(TRAINED) for p in ports}, {(p.host, p.netdev): p.key for p in ports},
                          applied.first_sent_ns, applied.timing.completed_ns, group.convert, grace_ns=0,
                          before={p.key: dict(self._values.get((p.host, p.netdev), {})) for p in ports},
                          note=self._note)
        wait = deadline if isinstance(deadline, Deadline) else Deadline(deadline)
        arrivals = log.expect(watch, wait, group.on_fault)
        log.flush()
        up = watch.complete()
        seen = "" if up else "; ".join([watch.describe()] + [cause for _, cause in arrivals.causes])
        return Wired(applied, up, (now_ns() - applied.first_sent_ns) / 1e9, seen, arrivals)

    def _note(self, obs) -> None:
        if obs.kind == "watch":
            self._values.setdefault((obs.host, obs.netdev), {})[obs.field] = obs.value

    def _watch(self, sessions: dict, ports, log, watch_us: int) -> None:
        """A watch (carrier, operstate, RDMA port state) on each port not yet watched in this run, its current
        values in before the first command (a change seen before them would read as a current value)."""
        new: dict[str, list] = {}
        for p in ports:
            if (p.host, p.netdev) not in self._watched:
                new.setdefault(p.host, []).append(p)
        for host, mine in new.items():
            sessions[host].start_watch([(p.netdev, p.rdma_dev, p.rdma_port) for p in mine], watch_us, 0, log)
        ready = Deadline(WATCH_READY_S)
        for host, mine in new.items():
            if missing := sessions[host].wait_watching(ready):
                raise DeviceError(f"host {host}: link watch gave no current value of {', '.join(missing)} "
                                  f"within {WATCH_READY_S:g} s")
            self._watched.update((host, p.netdev) for p in mine)
