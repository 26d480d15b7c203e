"""pytest plugin: a lab's bench as fixtures, the way labgrid's plugin gives `--lg-env` and `target`.

    pytest --bench emulated:burst-mode          # the default is emulated:instant
    pytest --bench emulated:instant?ocs=polatis-scpi
    pytest --bench lab-a.yaml                   # a real bench: its inventory

Fixtures
  bench         BenchHandle: the inventory's resources (`.resources`), whether the bench is emulated, its
                inventory file; on an `emulated:` spec one emulated bench serves the whole session.
  ocs           the driver of the bench's OCS (the only one, or `--bench-ocs NAME`), leased for the session;
                after each test the cross-connects on the allowed ports are put back as the test found them,
                and that is verified (a teardown error otherwise).
  hosts         {host name: SshTransport}, strict host keys unless the inventory says the bench is emulated.
  run_playbook  run_playbook(PLAYBOOK, **options) runs a playbook like `harness run` (each run in its own
                directory under the test's tmp_path) and returns a PlaybookRun. On an `emulated:` spec every
                run starts its own emulated bench, so its record has ground truth; pass bench=... to choose.
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


def pytest_addoption(parser) -> None:
    group = parser.getgroup("ocs-hil", "ocs-hil bench")
    group.addoption("--bench", dest="hil_bench", default=None,
                    help=f"emulated:PROFILE[?ocs=PROTOCOL] or a bench inventory YAML (default {DEFAULT_BENCH}; "
                         "ini: hil_bench)")
    group.addoption("--bench-ocs", dest="hil_bench_ocs", default=None,
                    help="the OCS the `ocs` fixture drives when the inventory has several")
    group.addoption("--bench-seed", dest="hil_bench_seed", type=int, default=0,
                    help="seed of the session's emulated bench")
    parser.addini("hil_bench", "default --bench", default=DEFAULT_BENCH)


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "hardware: needs a real bench; skipped on an emulated one")


def _bench_spec(config) -> str:
    return config.getoption("hil_bench") or config.getini("hil_bench") or DEFAULT_BENCH


def _spec_is_emulated(spec: str) -> bool:
    from harness.runner import emulated_spec

    if emulated_spec(spec):
        return True
    from harness.config import load_inventory

    return load_inventory(spec).emulated


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


@pytest.fixture(scope="session")
def _hil_switch(pytestconfig, hil_bench):
    from devices.ocs import open_switch
    from harness.lock import BenchLease, BenchLocked, ocs_lock_key

    names = sorted(hil_bench.resources.ocs)
    wanted = pytestconfig.getoption("hil_bench_ocs")
    if wanted is None and len(names) != 1:
        raise pytest.UsageError(f"the bench has OCSs {', '.join(names) or 'none'}: choose one with --bench-ocs")
    name = wanted or names[0]
    if name not in hil_bench.resources.ocs:
        raise pytest.UsageError(f"--bench-ocs {name}: the bench has {', '.join(names)}")
    resource = hil_bench.resources.ocs[name]
    lease = BenchLease([ocs_lock_key(name, resource.url)], run_id="pytest")
    try:
        lease.acquire()
    except BenchLocked as exc:
        pytest.fail(f"ocs {name}: {exc}", pytrace=False)
    try:
        switch = open_switch(resource)
        try:
            yield switch, resource.allowed_ports
        finally:
            switch.close()
    finally:
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
    """run_playbook(playbook, *, bench=None, seed=None, cycles=None, resume=None) -> PlaybookRun."""
    from harness.runner import RunOptions, run

    made = request.node.stash.setdefault(_RUN_DIRS, [])

    def run_it(playbook, *, bench: str | None = None, seed: int | None = None, cycles: int | None = None,
               resume: str | None = None) -> PlaybookRun:
        out = None if resume else tmp_path / f"run-{len(made) + 1}"
        options = RunOptions(playbook=str(playbook), bench=bench or _bench_spec(pytestconfig),
                             out=None if out is None else str(out), seed=seed, cycles=cycles, resume=resume,
                             quiet=True, json=True)
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = run(options)
        result = _result_line(stdout.getvalue())
        run_dir = Path(result["run_dir"]) if result.get("run_dir") else None
        if run_dir is not None:
            made.append(run_dir)
        return PlaybookRun(code, result.get("status", "error"), run_dir, result.get("checks", []))

    return run_it


def _result_line(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if re.match(r"\s*\{", line):
            return json.loads(line)
    raise AssertionError(f"harness run printed no result line; it printed: {text[-2000:]!r}")
