"""pytest plugin: a lab's bench as fixtures, the way labgrid's plugin gives `--lg-env` and `target`.

    pytest --bench emulated:burst-mode          # the default is emulated:instant
    pytest --bench emulated:instant?ocs=polatis-scpi
    pytest --bench emulated:instant?ocs=polatis-tl1,polatis-scpi   # two switches: `ocs` tests run once per switch
    pytest --bench lab-a.yaml                   # a real bench: its inventory

Fixtures
  bench         BenchHandle: the inventory's resources (`.resources`), whether the bench is emulated, its
                inventory file; on an `emulated:` spec one emulated bench serves the whole session.
  ocs           the driver of the bench's OCS, leased for the session; on a bench with several a test that
                uses it runs once per switch (`test_x[ocs2]`; `--bench-ocs NAME`: that one only), `ocs_name`
                saying which; after each test the cross-connects on the allowed ports are put back as the
                test found them, and that is verified (a teardown error otherwise).
  hosts         {host name: SshTransport}, strict host keys unless the inventory says the bench is emulated.
  run_playbook  run_playbook(PLAYBOOK, **options) runs a playbook as `harness run --json` does (each run in
                its own directory under the test's tmp_path) and returns a PlaybookRun: bad input is exit 2
                with the message in `.error`, never an exception. On an `emulated:` spec every run starts its
                own emulated bench, so its record has ground truth; pass bench=... to choose. A run on the
                session's own inventory takes the bench lease from the `ocs` fixture for its duration.
Marker
  @pytest.mark.hardware   the test needs a real bench: skipped on an emulated one, with the reason.
A failing test's report names the run directories it made.

The plugin imports the harness lazily: loading it costs a pytest session nothing until a fixture is used.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

DEFAULT_BENCH = "emulated:instant"
_RUN_DIRS = pytest.StashKey[list]()
_SESSION_LEASE = pytest.StashKey["_SessionLease"]()


def pytest_addoption(parser) -> None:
    group = parser.getgroup("ocs-hil", "ocs-hil bench")
    group.addoption("--bench", dest="hil_bench", default=None,
                    help=f"emulated:PROFILE[?ocs=PROTOCOL] or a bench inventory YAML (default {DEFAULT_BENCH}; "
                         "ini: hil_bench)")
    group.addoption("--bench-ocs", dest="hil_bench_ocs", default=None,
                    help="the OCS the `ocs` fixture drives when the inventory has several (default: each)")
    group.addoption("--bench-seed", dest="hil_bench_seed", type=int, default=0,
                    help="seed of the session's emulated bench")
    parser.addini("hil_bench", "default --bench", default=DEFAULT_BENCH)


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "hardware: needs a real bench; skipped on an emulated one")


def _bench_spec(config) -> str:
    return config.getoption("hil_bench") or config.getini("hil_bench") or DEFAULT_BENCH


def _spec_is_emulated(spec: str) -> bool:
    from harness.benchspec import emulated_spec

    if emulated_spec(spec):
        return True
    from harness.config import load_inventory

    return load_inventory(spec).emulated


def _switch_names(config) -> list[str]:
    """The bench's switches the `ocs` fixture drives (`--bench-ocs`, else every one), known at collection:
    an emulated spec serves one per protocol it names, as ocs1, ocs2, ...; an inventory names its own."""
    from harness.errors import InputError
    from harness.benchspec import emulated_spec

    wanted = config.getoption("hil_bench_ocs")
    if wanted is not None:
        return [wanted]
    spec = _bench_spec(config)
    try:
        emulated = emulated_spec(spec)
        if emulated:
            return [f"ocs{i + 1}" for i in range(len(emulated[2].split(",")))]
        from harness.config import load_inventory

        return list(load_inventory(spec).ocs)
    except InputError as exc:
        raise pytest.UsageError(exc.format()) from None


def pytest_generate_tests(metafunc) -> None:
    if "ocs" in metafunc.fixturenames:
        names = _switch_names(metafunc.config)
        if len(names) > 1:
            metafunc.parametrize("ocs_name", names, indirect=True, scope="session")


@pytest.fixture(scope="session")
def ocs_name(request, pytestconfig) -> str:
    """The switch the `ocs` fixture drives in this test."""
    return getattr(request, "param", None) or _switch_names(pytestconfig)[0]


def pytest_runtest_setup(item) -> None:
    if item.get_closest_marker("hardware") is None:
        return
    spec = _bench_spec(item.config)
    if _spec_is_emulated(spec):
        pytest.skip(f"needs a real bench (--bench INVENTORY.yaml); this session's bench is {spec}, emulated")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    run_dirs = item.stash.get(_RUN_DIRS, None)
    if report.failed and run_dirs:
        report.sections.append(("ocs-hil run directories", "\n".join(str(d) for d in run_dirs)))


@dataclass(frozen=True)
class BenchHandle:
    """The session's bench: `resources` (devices.resources.Bench) as the inventory describes it."""

    spec: str
    resources: Any
    inventory: Path
    emulator: Any = None  # devices.emulated.bench.EmulatedBench on an emulated spec

    @property
    def emulated(self) -> bool:
        return bool(self.resources.emulated)


@dataclass(frozen=True)
class PlaybookRun:
    """What `harness run --json` reports, with the run record's files one call away."""

    exit_code: int
    status: str
    run_dir: Path | None
    checks: list = field(default_factory=list)
    error: str | None = None  # bad input (exit 2): the harness's file:line message

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.status == "ok"

    def _json(self, name: str) -> dict:
        return json.loads((self.run_dir / name).read_text())

    def summary(self) -> dict:
        return self._json("summary.json")

    def manifest(self) -> dict:
        return self._json("manifest.json")

    def events(self):
        import pandas as pd

        return pd.read_parquet(self.run_dir / "events.parquet")

    def ground_truth(self):
        """The emulator's truth for this run, or None on a real bench."""
        import pandas as pd

        path = self.run_dir / "ground_truth.parquet"
        return pd.read_parquet(path) if path.exists() else None


@pytest.fixture(scope="session")
def hil_bench(pytestconfig, tmp_path_factory):
    """The bench behind `bench`, `ocs` and `hosts` (named apart so a project's own `bench` fixture can
    coexist with the plugin)."""
    from harness.errors import InputError
    from harness.runner import resolve_bench

    spec = _bench_spec(pytestconfig)
    with contextlib.ExitStack() as stack:
        try:
            resources, emulator = resolve_bench(spec, pytestconfig.getoption("hil_bench_seed"), stack,
                                                tmp_path_factory.mktemp("hil-bench"))
        except InputError as exc:
            raise pytest.UsageError(exc.format()) from None
        yield BenchHandle(spec, resources, emulator.inventory_path if emulator is not None else Path(spec),
                          emulator)


@pytest.fixture(scope="session")
def bench(hil_bench):
    return hil_bench


class _SessionLease:
    """The `ocs` fixture's lease on the session's switch, lent to a run that drives the same switch (the
    runner takes the bench lease itself, and must not find it held by its own test session) and taken back
    after it."""

    def __init__(self, keys: list[str]):
        self.keys = keys
        self.lease = None

    def acquire(self) -> None:
        from harness.lock import BenchLease, BenchLocked

        try:
            self.lease = BenchLease(self.keys, run_id="pytest").acquire()
        except BenchLocked as exc:
            pytest.fail(f"ocs: {exc}", pytrace=False)

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def _leased_by(self, bench_spec: str) -> bool:
        """Whether a run on `bench_spec` takes this lease: an inventory naming the same switch (by address)."""
        from harness.config import load_inventory
        from harness.errors import InputError
        from harness.lock import ocs_lease_keys
        from harness.benchspec import emulated_spec

        try:
            if emulated_spec(bench_spec) is not None or not Path(bench_spec).is_file():
                return False
            bench = load_inventory(bench_spec)
        except InputError:
            return False  # the run itself reports it
        return bool(set(self.keys) & {k for r in bench.ocs.values() for k in ocs_lease_keys(r)})

    @contextlib.contextmanager
    def lent_to(self, bench_spec: str):
        if self.lease is None or not self._leased_by(bench_spec):
            yield
            return
        self.release()
        try:
            yield
        finally:
            self.acquire()


@pytest.fixture(scope="session")
def _hil_switch(pytestconfig, hil_bench, ocs_name):
    from devices.ocs import open_switch
    from harness.lock import ocs_lease_keys

    names = sorted(hil_bench.resources.ocs)
    name = ocs_name
    if name not in hil_bench.resources.ocs:
        raise pytest.UsageError(f"--bench-ocs {name}: the bench has {', '.join(names)}")
    resource = hil_bench.resources.ocs[name]
    lease = _SessionLease(ocs_lease_keys(resource))
    lease.acquire()
    pytestconfig.stash[_SESSION_LEASE] = lease
    try:
        switch = open_switch(resource)
        try:
            yield switch, resource.allowed_ports
        finally:
            switch.close()
    finally:
        del pytestconfig.stash[_SESSION_LEASE]
        lease.release()


@pytest.fixture
def ocs(_hil_switch):
    """The OCS driver; the allowed ports' cross-connects are restored and verified after the test."""
    switch, allowed = _hil_switch

    def on_allowed(patches):
        return {i: e for i, e in patches.items() if i in allowed or e in allowed}

    before = on_allowed(switch.patches())
    yield switch
    with contextlib.suppress(Exception):
        switch.reconnect()  # a test may have left the session in any state
    if on_allowed(switch.patches()) != before:
        switch.apply(before, exclusive=True)
        after = on_allowed(switch.patches())
        if after != before:
            pytest.fail(f"ocs: could not restore the cross-connects the test found: {before} != {after}",
                        pytrace=False)


@pytest.fixture(scope="session")
def hosts(hil_bench):
    from devices.ssh import SshTransport

    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(SshTransport(resource))
               for name, resource in hil_bench.resources.hosts.items()}


@pytest.fixture
def run_playbook(request, pytestconfig, tmp_path):
    """run_playbook(playbook=None, *, bench=None, seed=None, cycles=None, resume=None, dry_run=False,
    quiet=True) -> PlaybookRun: `harness run` with those options and `--json`, in this process."""
    from harness.cli import main

    made = request.node.stash.setdefault(_RUN_DIRS, [])

    def run_it(playbook=None, *, bench: str | None = None, seed: int | None = None, cycles: int | None = None,
               resume: str | None = None, dry_run: bool = False, quiet: bool = True) -> PlaybookRun:
        argv = ["run", "--json"] + ([str(playbook)] if playbook is not None else [])
        if resume is not None:
            argv += ["--resume", str(resume)] + (["--bench", bench] if bench else [])
        else:
            bench = bench or _bench_spec(pytestconfig)
            argv += ["--bench", bench, "--out", str(tmp_path / f"run-{len(made) + 1}")]
        for flag, value in (("--seed", seed), ("--cycles", cycles)):
            argv += [flag, str(value)] if value is not None else []
        argv += ["--dry-run"] * dry_run + ["-q"] * quiet
        session_lease = pytestconfig.stash.get(_SESSION_LEASE, None)
        stdout = io.StringIO()
        with session_lease.lent_to(bench) if session_lease and bench else contextlib.nullcontext(), \
                contextlib.redirect_stdout(stdout):
            code = main(argv)
        result = _result_line(stdout.getvalue())
        run_dir = Path(result["run_dir"]) if result.get("run_dir") else None
        if run_dir is not None and run_dir.exists():
            made.append(run_dir)
        return PlaybookRun(code, result.get("status", "error"), run_dir, result.get("checks", []),
                           result.get("error"))

    return run_it


def _result_line(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if re.match(r"\s*\{", line):
            return json.loads(line)
    raise AssertionError(f"harness run printed no result line; it printed: {text[-2000:]!r}")
