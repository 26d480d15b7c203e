"""All emulator glue of the harness in one module (no step imports devices.emulated): fault plans and
their arming per cycle, the disk-full fault through the event log's public hook. On a real bench every
function here is a no-op or refuses `faults:` with a clear input error."""
from __future__ import annotations

import contextlib

from devices.emulated.faults import FaultEntry  # noqa: F401  (the declared fault kinds, for step parameters)
from devices.timing import now_ns
from harness.config import load_yaml
from harness.errors import InputError
from harness.specs import validate


def _where(node, step, key=None) -> tuple[str | None, int | None]:
    """(file, line) of a playbook node (or one of its keys), else the step's."""
    where = getattr(node, "where", None)
    if where is not None:
        try:
            return where(key) if key is not None else where()
        except (KeyError, TypeError):
            pass
    return step.file, step.line


def load_profile(name_or_path: str):
    """A timing profile (built-in name or file) through the harness's YAML loader: every problem of the file
    at its `file:line` (InputError / InputErrors), `${ENV}` templating and `include:` as in every input."""
    from devices.emulated.profile import ProfileError, ProfileSpec, profile_from_spec, profile_path

    try:
        path = profile_path(name_or_path)
    except ProfileError as exc:
        raise InputError(str(exc)) from None
    data = load_yaml(path).data
    return profile_from_spec(validate(ProfileSpec, data, "", (data.file, data.line)), str(path))


def truth_frame(emulated, cycle_starts: list[tuple[int, int]], stages: tuple[str, ...] | None = None):
    """The emulator's ground truth of `stages` (default: the recorded stages, harness.events.STAGES; the
    switch's own record: analysis.accuracy.OCS_TRUTH_STAGES) with cycles assigned from the steps' cycle starts
    (None: a real bench)."""
    if emulated is None:
        return None
    from analysis.accuracy import assign_cycles
    from harness.events import STAGES

    stages = set(STAGES if stages is None else stages)
    if emulated.netns is not None:
        # Real frames cross the namespaces: the physics' modelled first packet is not the truth there.
        stages.discard("first_packet")
    truth = assign_cycles(emulated.ground_truth_frame(stages), cycle_starts)
    return truth[truth["cycle"] >= 1]


def flap_truth_ns(emulated, keys: list[str], after_ns: int) -> tuple[int, int] | None:
    """The emulator's truth of a link flap of `keys` ("host:netdev") after `after_ns`, harness ns: (the first
    of their links down, the instant the last loss of light among them was detected by the packet fabric —
    its traffic re-spread)."""
    from devices.emulated.dataplane import detection_ns

    lost: dict[str, int] = {}
    down = None
    for r in emulated.ground_truth():
        key = f"{r['host']}:{r['port']}"
        if r["t_ns"] <= after_ns or key not in keys:
            continue
        if r["stage"] == "light_lost":
            lost.setdefault(key, int(r["t_ns"]))
        elif r["stage"] == "port_down" and down is None:
            down = int(r["t_ns"])
    if down is None or not lost:
        return None
    return down, max(t + detection_ns(emulated.profile, key, t) for key, t in lost.items())


def harness_ns(emulated, host: str, host_ns: int) -> int:
    """The harness instant at which emulated `host`'s clock read `host_ns` (its clock's own inverse, to the
    ns: the drift term is an int of the harness time, so a few fixed-point steps settle it)."""
    c = emulated.physics.host_clock_params(host)
    base = int(host_ns) - c["epoch_ns"] - c["offset_ns"]
    t = base
    for _ in range(4):
        t = base - int(c["drift_ppm"] * 1e-6 * (t - c["t0_ns"]))
    return t


def emulated_clocks(emulated) -> dict:
    """Every emulated host's true clock parameters (for the manifest: how far the correction was off)."""
    return {h: emulated.physics.host_clock_params(h) for h in emulated.physics.hosts}


class Faults:
    """The faults a step injects on the emulated bench: `faults:` entries of the step plus the profile's
    `faults: {inject: [...]}`, planned per cycle from the run's seed."""

    def __init__(self, ctx, step, entries: list, cycles: int, ports: list[str]):
        self.ctx, self.step = ctx, step
        self.plan: dict = {}
        self.injector = None
        profile = getattr(getattr(ctx.emulated, "profile", None), "faults", None) or {}
        every = list(entries) + list(profile.get("inject") or [])
        if not every:
            return
        if ctx.emulated is None:
            raise InputError(f"step {step.name}: faults: can only be injected on an emulated bench",
                             *_where(entries, step))
        from devices.emulated.faults import FaultInjector, FaultSpecError, plan_faults

        try:
            self.plan = plan_faults(every, cycles, ctx.rng(f"faults:{step.name}"))
        except FaultSpecError as exc:
            if exc.index >= len(entries):  # from the profile's `faults: {inject: [...]}`
                raise InputError(f"profile faults.inject[{exc.index - len(entries)}]: "
                                 f"{str(exc).split(': ', 1)[-1]}", ctx.emulated.profile.path) from None
            node = entries[exc.index] if exc.index >= 0 else entries
            raise InputError(f"step {step.name}: {exc}", *_where(node, step, exc.key)) from None
        if not ctx.dry_run:
            self.injector = FaultInjector(ctx.emulated, ports, ctx.rng(f"fault-targets:{step.name}"))

    @property
    def fired(self) -> list[dict]:
        return self.injector.fired if self.injector else []

    @contextlib.contextmanager
    def armed(self, cycle: int, *, measured: bool = True):
        """Arm this cycle's faults for the duration of the block (none on an unmeasured settling cycle, and a
        harness kill only once: a resumed run is not killed again)."""
        faults = self.plan.get(cycle, []) if measured and self.injector else []
        if any(f.kind == "harness_kill" for f in faults) and self.ctx.resume_after:
            faults = [f for f in faults if f.kind != "harness_kill"]
        if not faults:
            yield
            return
        self.injector.arm(cycle, faults)
        for fault in faults:
            if fault.kind == "disk_full":
                from devices.emulated.faults import FullDiskFile

                self.ctx.log.wrap_file(FullDiskFile).armed = True
                self.injector.fired.append({"cycle": cycle, "kind": "disk_full", "target": str(self.ctx.log.path),
                                            "t_ns": now_ns()})
        try:
            yield
        finally:
            self.injector.disarm()

    def record(self) -> None:
        if self.injector is not None:
            self.ctx.manifest_extra.setdefault("faults_injected", {})[self.step.name] = self.injector.fired


class ServingEndpoint:
    """The emulated vLLM endpoint a serving step replays against when the bench names no URL:
    `async with ServingEndpoint(params) as endpoint:` then `endpoint.url`, `endpoint.interfere(...)`."""

    def __init__(self, p: dict):
        from analysis.serving import ServiceModel
        from devices.emulated.vllm_server import VllmEmulator

        self.server = VllmEmulator(ServiceModel.of_step(p), model=p["model"])

    @property
    def url(self) -> str:
        return self.server.url

    def interfere(self, windows, capacity: float, epoch_ns: int) -> None:
        """Cut the service's capacity to `capacity` inside the windows (a frame of start_s/end_s in the
        trace's seconds, which begin at `epoch_ns` on the harness clock)."""
        from analysis.serving import InterferenceWindow

        self.server.set_interference(InterferenceWindow.from_frame(windows, capacity), epoch_ns=epoch_ns)

    async def __aenter__(self) -> "ServingEndpoint":
        await self.server.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.server.stop()


_LAZY = {"ProfileError": "devices.emulated.profile"}


def __getattr__(name: str):
    """The emulator's serving model and profiles, for steps that evaluate a model of the bench; imported on
    first use (the serving emulator pulls in its HTTP and metrics libraries, which a plain run does not need)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
