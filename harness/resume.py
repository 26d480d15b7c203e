"""A resumed run is the same run. What identifies a run (playbook as run, bench and its content, cycles,
seed) is recorded in its manifest at the start, with copies of the inputs in `RUN_DIR/inputs/`;
`harness run --resume RUN_DIR` takes all of it from there, and refuses (exit 2) anything that differs, a
finished run, or a run directory another process holds (harness.lock.RunDirLock)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from harness import record as rec
from devices.resources import Bench
from harness.bench.emulated import load_profile
from harness.benchspec import BENCH_KINDS, emulated_spec
from harness.config import Playbook, load_inventory, load_playbook
from harness.errors import InputError

INPUTS = "inputs"
RESUMABLE = (None, "aborted", "error")  # killed (no status yet), stopped by a signal, stopped by a fault


@dataclass(frozen=True)
class RunIdentity:
    playbook: str
    playbook_digest: str  # sha256 over the playbook as run: steps, their parameters, options
    bench: str  # the bench spec as given
    bench_digest: str  # sha256 of the inventory's bytes, or of the emulator profile's
    cycles: int
    seed: int


def playbook_as_run(playbook: Playbook, *, as_written: bool = False) -> dict:
    """The playbook with includes, ${ENV} and defaults resolved (what the steps actually received);
    `as_written`: each string that came from the environment as its `${NAME}` again (what a record keeps:
    a token in the environment never lands in a file)."""
    data = rec.to_jsonable({"name": playbook.name, "description": playbook.description, "bench": playbook.bench,
                            "seed": playbook.seed, "cycles": playbook.cycles, **playbook.options,
                            **({"imports": list(playbook.imports)} if playbook.imports else {}),
                            "steps": [{"type": s.type, "name": s.name, **s.params} for s in playbook.steps]})
    return _as_written(data, playbook.templates) if as_written and playbook.templates else data


def _as_written(value, templates: dict[str, str]):
    if isinstance(value, str):
        return templates.get(value, value)
    if isinstance(value, dict):
        return {k: _as_written(v, templates) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_written(v, templates) for v in value]
    return value


def playbook_digest(playbook: Playbook) -> str:
    data = playbook_as_run(playbook)
    for key in ("bench", "seed", "cycles"):  # defaults only: the run's own values are compared separately
        data.pop(key)
    return rec.sha256_text(json.dumps(data, sort_keys=True))


def bench_kind(spec: str) -> str:
    """What kind of bench a spec names: an inventory, or the emulator kind with the switch's protocol."""
    parsed = emulated_spec(spec)
    return f"{parsed[0]}?ocs={parsed[2]}" if parsed else "inventory"


@dataclass(frozen=True)
class BenchSource:
    """A bench spec read once: the file behind it (the inventory, or the emulator profile; None for a built-in
    profile), the bytes that were hashed and are kept in `inputs/`, and for an inventory the Bench parsed from it —
    the one the lease, the recovery marks and the run all use."""

    spec: str
    path: Path | None
    data: bytes | None
    inventory: Bench | None

    @property
    def digest(self) -> str:
        return rec.sha256_text(self.data if self.data is not None else self.spec)


def read_bench(spec: str) -> BenchSource:
    """The bench spec's file, read and (an inventory) validated before any run directory exists."""
    parsed = emulated_spec(spec)
    if parsed:
        profile = load_profile(parsed[1])
        path = Path(profile.path) if profile.path else None
        return BenchSource(spec, path, path.read_bytes() if path else None, None)
    path = Path(spec)
    if not path.is_file():
        raise InputError(f"--bench: no such inventory file, and not one of {', '.join(BENCH_KINDS)}", spec)
    data = path.read_bytes()
    return BenchSource(spec, path, data, load_inventory(path))


def identity(playbook: Playbook, bench: BenchSource, cycles: int, seed: int) -> RunIdentity:
    return RunIdentity(playbook.name, playbook_digest(playbook), bench.spec, bench.digest, cycles, seed)


def keep_inputs(run_dir: Path, playbook: Playbook, bench: BenchSource) -> None:
    """Copies of what the run ran: the playbook as run, and the inventory or profile bytes its digest covers."""
    inputs = run_dir / INPUTS
    inputs.mkdir(exist_ok=True)
    rec.write_text_atomic(inputs / "playbook.yaml", "# the playbook as run (includes and defaults resolved, "
                          "${ENV} strings as written)\n"
                          + yaml.safe_dump(playbook_as_run(playbook, as_written=True), sort_keys=False))
    if bench.data is not None:
        (inputs / ("bench.yaml" if bench.inventory is not None else "profile.yaml")).write_bytes(bench.data)


@dataclass
class Resumed:
    run_dir: Path
    manifest: dict
    playbook: Playbook
    identity: RunIdentity
    bench: BenchSource


def _refuse(what: str, run_dir: Path) -> InputError:
    return InputError(f"--resume: {what}", str(run_dir))


def plan_resume(run_dir: Path, *, playbook_path: str | None, bench: str | None, cycles: int | None,
                seed: int | None) -> Resumed:
    """The recorded run, or InputError naming what would make it a different run."""
    manifest_path = run_dir / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise _refuse("not a run directory (no manifest.json)", run_dir) from None
    except (OSError, ValueError) as exc:
        raise _refuse(f"unreadable manifest.json: {exc}", run_dir) from None
    recorded = manifest.get("run") if isinstance(manifest, dict) else None
    if not isinstance(recorded, dict):
        raise _refuse("the run record has no run identity (recorded by an older harness); start a new run",
                      run_dir)
    was = RunIdentity(**recorded)
    status = manifest.get("status")
    if status not in RESUMABLE:
        raise _refuse(f"the run is finished (status {status}); start a new run", run_dir)
    copy = run_dir / INPUTS / "playbook.yaml"
    playbook = load_playbook(playbook_path or copy)
    if playbook_digest(playbook) != was.playbook_digest:
        raise _refuse(f"{playbook_path} is not the playbook this run ran ({copy} is); start a new run", run_dir)
    if playbook_path is None:  # the copy stands in for the original: keep the original's name and hash
        playbook = Playbook(**{**playbook.__dict__, "source": manifest["playbook"]["source"],
                               "sha256": manifest["playbook"]["sha256"]})
    if cycles is not None and cycles != was.cycles:
        raise _refuse(f"this run has {was.cycles} cycles, not {cycles}; start a new run", run_dir)
    if seed is not None and seed != was.seed:
        raise _refuse(f"this run has seed {was.seed}, not {seed}; start a new run", run_dir)
    spec = bench or was.bench
    if not emulated_spec(spec) and not Path(spec).is_file() and bench is None:
        spec = str(run_dir / INPUTS / "bench.yaml")  # the original inventory is gone: its copy
    kind, _, rest = spec.partition(":")
    profile, sep, query = rest.partition("?")
    if bench is None and emulated_spec(spec) and Path(profile).suffix and not Path(profile).is_file():
        spec = f"{kind}:{run_dir / INPUTS / 'profile.yaml'}{sep}{query}"  # the profile file is gone: its copy
    source = read_bench(spec)
    if bench_kind(spec) != bench_kind(was.bench) or source.digest != was.bench_digest:
        raise _refuse(f"this run ran on {was.bench} (sha256 {was.bench_digest[:12]}); {spec} is a different "
                      "bench (or it changed since); start a new run", run_dir)
    return Resumed(run_dir, manifest, playbook, RunIdentity(was.playbook, was.playbook_digest, spec,
                                                            was.bench_digest, was.cycles, was.seed), source)


def identity_record(ident: RunIdentity) -> dict:
    return asdict(ident)
