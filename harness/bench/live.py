"""The one object a step is handed for the bench (`ctx.bench`), after labgrid's Target: a step asks it for what
it drives — the guarded circuits of a switch, the hosts' sessions, the one observation log, the transfer tools'
results, the serving endpoint, the links wired and trained (`links.wire`) — and for what the bench is: its provenance, and the emulator's own record
(`truth`, None on a real bench). A step imports no emulator glue, device parser or other step: what it needs
from the bench is a facet here, so the safety rules (lease, restore) live once, under every step.

`FakeLiveBench` (harness.bench.fake) has the same facets without a run, for testing one step's logic."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.bench import emulated
from harness.bench.links import Links
from harness.provenance import provenance

FaultEntry = emulated.FaultEntry  # the declared fault kinds, for a step's `faults:` parameter

if TYPE_CHECKING:
    from harness.bench.circuits import CircuitGuard
    from harness.bench.emulated import Faults
    from harness.bench.observe import ObservationLog


class Truth:
    """What only an emulated bench knows: its timing profile (the model the delays are drawn from) and its own
    record of what happened, to judge the harness's measurements against."""

    def __init__(self, emulated):
        self._emulated = emulated

    @property
    def profile(self):
        """The emulator's timing profile (devices.emulated.profile.Profile)."""
        return self._emulated.profile

    def draws(self):
        """Every delay the emulator drew, with when its action was due and when it ran (a DataFrame)."""
        return self._emulated.physics.draws_frame()

    def fabric_flap(self, links, after_ns: int) -> tuple[int, int] | None:
        """The emulated fabric's truth of a flap of the leaf–spine `links` shut after `after_ns`, harness ns (the
        last of them dark, routed around); None if it saw none."""
        from devices.emulated.leafspine import flap_truth_ns

        return flap_truth_ns(self._emulated.physics, links, after_ns)

    def harness_ns(self, host: str, host_ns: int) -> int:
        """The harness instant at which `host`'s emulated clock read `host_ns` (no uncertainty)."""
        return emulated.harness_ns(self._emulated, host, host_ns)

    def flap(self, keys: list[str], after_ns: int) -> tuple[int, int] | None:
        """(the first of the links of `keys` down, the instant the packet fabric detected the last loss of light
        among them), harness ns, for a flap after `after_ns`; None if the emulator saw none."""
        from harness.bench.emulated import flap_truth_ns

        return flap_truth_ns(self._emulated, keys, after_ns)


class Hosts:
    """The hosts' sessions (one SSH connection, agent and clock tracker per host in a run)."""

    def __init__(self, ctx):
        self._ctx = ctx

    def session(self, host: str):
        return self._ctx.session(host)

    def open(self, hosts) -> dict[str, Any]:
        """The sessions of `hosts`, those not yet open opened in parallel."""
        return self._ctx.open_sessions(hosts)


class Traffic:
    """The transfer tools' results, parsed (nccl-tests, perftest): a step reads numbers, not tool output."""

    @staticmethod
    def transfer_seconds(stdout: str, size_bytes: int) -> float:
        from harness.bench.traffic import transfer_seconds

        return transfer_seconds(stdout, size_bytes)

    @staticmethod
    def write_bandwidth_gbps(stdout: str) -> float:
        """ib_write_bw's average bandwidth of its last row (Gb/s; --report_gbits)."""
        from harness.bench.traffic import write_bandwidth_gbps

        return write_bandwidth_gbps(stdout)


class Serving:
    """The serving side: the endpoint a replay talks to (the step's URL, or the emulated vLLM endpoint)."""

    def __init__(self, live: "LiveBench"):
        self._live = live

    def endpoint(self, step, endpoint: str) -> str | None:
        """None for the emulated endpoint, else the validated base URL (loopback only on an emulated bench)."""
        from harness.bench.serving import check_endpoint

        return check_endpoint(step, endpoint, real_bench=self._live.truth is None)


class LiveBench:
    """The run's bench as a step sees it (see the module doc). Built by the runner from the run's context; the
    facets open what they reach on first use, and the run's teardown restores and closes it."""

    def __init__(self, ctx, emulated=None):
        self._ctx = ctx
        self.truth: Truth | None = Truth(emulated) if emulated is not None else None
        self.hosts = Hosts(ctx)
        self.traffic = Traffic()
        self.serving = Serving(self)
        self.links = Links(self)

    @property
    def inventory(self):
        """The bench's resources (devices.resources.Bench): switches, hosts, NIC ports."""
        return self._ctx.inventory

    def circuits(self, name: str, *, teardown_s: float = 15.0) -> "CircuitGuard":
        """The guard of OCS `name`: every apply checks the lease and the allowed ports; the circuits found are
        restored when the run ends, however it ends."""
        from harness.bench.circuits import guard

        return guard(self._ctx, name, teardown_s=teardown_s)

    def check_lease(self) -> None:
        """Refuse (BenchBroken, the run latched broken) once the bench lease is lost: a change a step makes outside
        the circuit guard (a fabric link shut by command) obeys the same rule as every apply."""
        from harness.bench import BenchBroken

        lease = getattr(self._ctx, "lease", None)
        if lease is not None and lease.lost and not self._ctx.dry_run:
            why = f"bench lock lost: {lease.lost}"
            self._ctx.latch_broken(why)
            raise BenchBroken(why)

    def observe(self) -> "ObservationLog":
        """The run's one observation log (opened on first use)."""
        from harness.bench.observe import observation_log

        return observation_log(self._ctx)

    def faults(self, step, entries: list, cycles: int, ports: list[str]) -> "Faults":
        """The faults `step` injects (its `faults:` plus the profile's), planned per cycle; a real bench refuses
        any (InputError at the step's line)."""
        from harness.bench.emulated import Faults

        return Faults(self._ctx, step, entries, cycles, ports)

    def model_profile(self, name_or_path: str):
        """A timing profile by name or file, as a model of a bench (not necessarily this one's): its problems at
        their file:line (InputError); a malformed one raises ValueError."""
        from harness.bench.emulated import load_profile

        return load_profile(name_or_path)

    def provenance(self) -> dict:
        """Where this run's delays come from (an emulated profile, or the real bench by name); the words a verdict
        on them may use: harness.provenance.evidence_words(prov)."""
        ctx = self._ctx
        profile = None
        if self.truth is not None:
            prof = self.truth.profile
            profile = {"name": prof.name, "source": prof.source, "copies": getattr(prof, "copies", None)}
        bench = getattr(ctx.inventory, "name", "") or str(ctx.playbook.bench)
        return provenance({"profile": profile, "extra": {"bench": bench}})
