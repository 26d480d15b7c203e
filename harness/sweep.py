"""Parameter sweeps: a playbook's `sweep:` block, a grid × seeds, each point an ordinary run directory.

```yaml
sweep:
  grid:                                  # every combination of the values below
    measure.watch_interval_us: [100, 200]    # STEP.PARAM[.KEY...]: a step parameter (by step name)
    verdict.baseline.skew: [0.3, 0.8]        # ... or an analysis assumption inside one
    profile.ocs.switch.ms: [10, 25]          # profile.FIELD[.KEY...]: the emulated bench's timing profile
    cycles: [5, 10]                          # the playbook's cycle count
  seeds: [1, 2, 3]                       # each grid point once per seed (default: the playbook's seed)
```

`harness sweep PLAYBOOK` runs every point through the same runner as `harness run` (a `harness run`
subprocess per point, so a point is exactly a run anyone can repeat: its playbook and profile are in the
point's `inputs/`) on a dask `distributed.LocalCluster`, or on `--scheduler tcp://HOST:PORT` (workers must
see the sweep directory and have the harness installed). Results are gathered into `results.parquet`, one row
per point with the parameters as columns. Each point's folder is named by its values
(`measure.pattern=ring-shift,seed=5`; `sweep.json` keeps the name of every point it ever planned). Rerunning
resumes: finished points are skipped, an interrupted one is resumed (`harness run --resume`). The grid may grow:
new values or seeds run only the new points. A point that has started is never redefined: if its playbook,
profile or bench would differ now, the sweep is refused (exit 2, naming the points), as is a grid with other
parameters. Points on a physical bench (an inventory) run one after another, each
under the bench lease the runner takes; if someone else holds the lease, the point waits for it. Emulated
points (each run has its own emulator) run in parallel.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness import record as rec
from harness.bench.emulated import load_profile
from harness.benchspec import emulated_spec
from harness.config import load_inventory, load_playbook, override
from harness.errors import InputError

SPEC_NAME = "sweep.json"
SPEC_FORMAT = 2
NAME_MAX = 100  # a point's folder name at most (its inputs add a suffix; file names stop at 255 bytes)
RESULTS_NAME = "results.parquet"
LEASE_WAIT_S = 600.0
LEASE_POLL_S = 2.0


# ------------------------------------------------------------------------------------------ points
@dataclass(frozen=True)
class Point:
    index: int
    params: dict  # grid key -> value
    seed: int
    name: str = ""  # its folder: readable_name, or the name sweep.json gave it first

    @property
    def key(self) -> str:
        return hashlib.sha256(self.identity.encode()).hexdigest()[:10]

    @property
    def identity(self) -> str:
        return json.dumps([rec.to_jsonable(self.params), self.seed], sort_keys=True)


_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(rec.to_jsonable(value), sort_keys=True, separators=(",", ":"))


def readable_name(point: Point) -> str:
    """`key=value,...,seed=N`, safe as a file name. Where a character had to be replaced, or the name would be
    longer than NAME_MAX, it is cut and ends in the point's hash, so two points never share a name."""
    pairs = [*((str(k), _value_text(v)) for k, v in point.params.items()), ("seed", str(point.seed))]
    raw = ",".join(f"{k}={v}" for k, v in pairs)
    safe = ",".join(f"{_UNSAFE.sub('_', k).strip('_')}={_UNSAFE.sub('_', v).strip('_')}" for k, v in pairs)
    if safe == raw and len(safe) <= NAME_MAX:
        return safe
    return hashed_name(point, safe)


def hashed_name(point: Point, base: str | None = None) -> str:
    base = readable_name(point) if base is None else base
    return f"{base[:NAME_MAX - len(point.key) - 1]}~{point.key}"


def expand(sweep: dict, default_seed: int) -> list[Point]:
    """Every grid combination × every seed, in a fixed order (grid keys as written, seeds innermost), each
    named by its values."""
    keys = list(sweep["grid"])
    seeds = sweep["seeds"] or [default_seed]
    combos = itertools.product(*(sweep["grid"][k] for k in keys))
    points = [Point(i, dict(zip(keys, values)), seed)
              for i, (values, seed) in enumerate((c, s) for c in combos for s in seeds)]
    return name_points(points, {})


def name_points(points: list[Point], known: dict[str, str]) -> list[Point]:
    """Each point named: the name `known` (identity -> name, from sweep.json) gave it, else its readable name,
    else (taken by another point) its hashed one."""
    taken = set(known.values())
    out = []
    for p in points:
        name = known.get(p.identity)
        if name is None:
            name = readable_name(p)
            if name in taken:
                name = hashed_name(p)
        taken.add(name)
        out.append(dataclasses.replace(p, name=name))
    return out


def point_playbook(playbook, point: Point) -> dict:
    """The playbook of one point as YAML data: the sweep block gone, the point's values in place, every
    parameter explicit, and relative file names made absolute so the point runs from its own folder."""
    steps = []
    for step in playbook.steps:
        params = {k: (str(step.resolve_path(v)) if isinstance(v, str) and v and not Path(v).is_absolute()
                      and step.resolve_path(v).exists() else v) for k, v in step.params.items()}
        for key, value in point.params.items():
            head, _, rest = key.partition(".")
            if head == step.name:
                params = override(params, rest, value)
        steps.append({"type": step.type, "name": step.name, **params})
    return rec.to_jsonable({"name": playbook.name, "description": playbook.description,
                      "cycles": point.params.get("cycles", playbook.cycles), "seed": point.seed, "steps": steps,
                      **playbook.options})


def point_profile(bench: str, point: Point) -> dict | None:
    """The emulated profile of one point as YAML data (the bench's profile with the point's fields), or
    None when the point changes no profile field."""
    from devices.emulated.profile import PROFILE_DIR

    fields = {k.partition(".")[2]: v for k, v in point.params.items() if k.startswith("profile.")}
    if not fields:
        return None
    name = _emulated_profile(bench)
    path = Path(name) if Path(name).suffix else PROFILE_DIR / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    for dotted, value in fields.items():
        data = override(data, dotted, value)
    return data


def _emulated_profile(bench: str) -> str:
    spec = emulated_spec(bench)
    if spec is None:
        raise InputError("sweep.grid: profile.* fields need an emulated bench (emulated:PROFILE)", bench)
    return spec[1]


def _with_profile(bench: str, profile_path: Path) -> str:
    kind, _, rest = bench.partition(":")
    _, _, query = rest.partition("?")
    return f"{kind}:{profile_path}" + (f"?{query}" if query else "")


# ------------------------------------------------------------------------------------------ running
@dataclass(frozen=True)
class PointJob:
    """What a worker needs to run one point (plain data: it travels to the cluster)."""

    name: str
    run_dir: str
    playbook: str
    bench: str
    seed: int
    physical: bool
    lease_wait_s: float = LEASE_WAIT_S  # how long a physical point waits for a bench lease someone else holds


def lease_wait_path(run_dir: Path) -> Path:
    """While a physical point waits for the bench lease: who holds it and since when (next to the point)."""
    return run_dir.with_name(f"{run_dir.name}.lease-wait.json")


def run_point(job: PointJob, _after: Any = None) -> dict:
    """Run (or resume, or skip when finished) one point with `harness run` in a subprocess; a row of facts.
    `_after` only orders physical points one after another (a dask dependency). point.json keeps the
    attempt's wall-clock start and end (ns) and how often the bench lease was refused before it."""
    run_dir = Path(job.run_dir)
    if _finished(run_dir):
        return {"point": job.name, "exit_code": _json(run_dir / "point.json").get("exit_code"), "ran": False}
    if run_dir.exists() and (run_dir / "events.jsonl").exists() and (run_dir / "events.jsonl").stat().st_size:
        args = ["run", "--resume", str(run_dir)]
    else:
        import shutil

        shutil.rmtree(run_dir, ignore_errors=True)  # nothing measured there yet: start the point afresh
        args = ["run", job.playbook, "--bench", job.bench, "--seed", str(job.seed), "--out", str(run_dir)]
    waiting = lease_wait_path(run_dir)
    deadline = time.monotonic() + job.lease_wait_s
    refusals, first_refused = 0, time.monotonic()
    while True:
        # Look before starting a run (no process per poll); the runner's own lease still decides a race.
        holder = _bench_holder(job) if job.physical else None
        if holder is None:
            started_ns = time.time_ns()
            proc = subprocess.run([sys.executable, "-m", "harness", *args, "-q"], capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL)
            if job.physical and proc.returncode == 2 and "bench is locked" in proc.stderr:
                holder = proc.stderr.strip().splitlines()[-1].partition("bench is locked: ")[2]
        if holder is None or time.monotonic() >= deadline:
            break
        refusals += 1  # another run holds the bench lease: wait for it, as a lab member would
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        rec.write_json_atomic(waiting, {"refusals": refusals, "waiting_s": round(time.monotonic() - first_refused, 1),
                                        "holder": holder})
        time.sleep(min(LEASE_POLL_S, max(0.0, deadline - time.monotonic())))
    if holder is not None:
        waiting.unlink(missing_ok=True)
        return {"point": job.name, "ran": True, "exit_code": 2, "lease_refusals": refusals,
                "error": f"bench is locked: {holder} (waited {job.lease_wait_s:g} s for the bench lease)"}
    waiting.unlink(missing_ok=True)
    facts = {"exit_code": proc.returncode, "started_ns": started_ns, "ended_ns": time.time_ns(),
             "lease_refusals": refusals}
    if proc.returncode == 2 or not (run_dir / "summary.json").exists():
        return {"point": job.name, "ran": True, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1],
                **facts}
    rec.write_json_atomic(run_dir / "point.json", facts)
    return {"point": job.name, "ran": True, **facts}


def _bench_holder(job: PointJob) -> str | None:
    """Who holds the lease on a switch of the point's inventory, if anyone does."""
    from harness.lock import live_holder, ocs_lease_keys

    bench = load_inventory(job.bench)
    return live_holder([k for r in bench.ocs.values() for k in ocs_lease_keys(r)])


def _finished(run_dir: Path) -> bool:
    return (run_dir / "point.json").exists() and (run_dir / "summary.json").exists()


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def result_row(point: Point, run_dir: Path, exit_code: int | None) -> dict:
    """One row: the point's parameters, seed and run directory, then what its run measured and concluded."""
    import pandas as pd

    row: dict[str, Any] = {k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in point.params.items()}
    row.update({"seed": point.seed, "point": point.name, "run_dir": run_dir.name, "exit_code": exit_code})
    record = _json(run_dir / "summary.json")
    summary = record.get("summary", {})
    row["outcome"] = record.get("outcome")
    delays = summary.get("delays_ms") or {}
    for stage, s in (delays.get("stages") or {}).items():
        row.update({f"{stage}_n": s["n"], f"{stage}_mean_ms": s["mean"], f"{stage}_p99_ms": s["p99"]})
    for name in ("ocs_switch", "turnaround"):
        if name in delays:
            row.update({f"{name}_mean_ms": delays[name]["mean"], f"{name}_p99_ms": delays[name]["p99"]})
    late = (summary.get("emulator") or {}).get("lateness_ms") or {}
    if late:  # a busy machine delivers emulated events late: measured times include it, the draws do not
        row["emulator_lateness_p99_ms"] = late.get("p99_ms")
    for acc in summary.get("accuracy") or []:
        if acc["stage"] == "all":
            row.update({"accuracy_abs_err_p99_ms": acc["abs_err_p99_ms"], "accuracy_coverage": acc["coverage"]})
    lost = summary.get("lost_events")
    if lost:  # true events of watched cycles without a recorded one, in cycles the harness called ok
        row.update({"true_events": lost["true"], "lost_in_ok_cycles": lost["in_ok_cycles"]})
    for step, result in (summary.get("results") or {}).items():
        for key, value in result.items():
            row[f"{step}.{key}"] = value if isinstance(value, (int, float, str, bool)) else json.dumps(value)
    draws = run_dir / "ground_truth_delays.parquet"
    if draws.exists():  # the emulator's drawn delays: the same seed and parameters give the same draws
        frame = pd.read_parquet(draws).sort_values(["command", "port", "stage"]).reset_index(drop=True)
        row["truth_draws"] = len(frame)
        row["truth_draws_sha256"] = hashlib.sha256(frame.to_csv(index=False).encode()).hexdigest()
        for stage, g in frame.groupby("stage"):
            row[f"truth_{stage}_mean_ms"] = float(g["delay_ns"].mean() / 1e6)
    return row


@dataclass
class SweepPlan:
    sweep_dir: Path
    points: list[Point]
    jobs: list[PointJob]
    physical: bool


def plan(playbook_path: str, *, bench: str | None, out: str | None, lease_wait_s: float = LEASE_WAIT_S) -> SweepPlan:
    """Validate, name the points (the names sweep.json gave them before), write their playbooks and profiles,
    and record every point in sweep.json. Refused: a point already started whose definition changed, a grid
    over other parameters."""
    playbook = load_playbook(playbook_path)
    if playbook.sweep is None:
        raise InputError("no sweep: block in this playbook (see `harness sweep --help`)", playbook_path)
    bench = bench or playbook.bench
    physical = emulated_spec(bench) is None
    if not physical:
        load_profile(_emulated_profile(bench))
    elif any(k.startswith("profile.") for k in playbook.sweep["grid"]):
        raise InputError("sweep.grid: profile.* fields need an emulated bench (emulated:PROFILE)", bench)
    else:
        bench = str(Path(bench).resolve())
    sweep_dir = Path(out or Path("runs") / f"{playbook.name}-sweep").resolve()
    spec_path = sweep_dir / SPEC_NAME
    keys = list(playbook.sweep["grid"])
    record = _json(spec_path) if spec_path.exists() else None
    if record is None and sweep_dir.exists() and any(sweep_dir.iterdir()):
        raise InputError("--out: exists, is not empty and holds no sweep", str(sweep_dir))
    if record is not None and record.get("format") != SPEC_FORMAT:
        raise InputError(f"{sweep_dir} holds a sweep recorded in format {record.get('format')} (this harness "
                         f"writes {SPEC_FORMAT}); sweep into a new --out", str(spec_path))
    if record is not None and record["keys"] != keys:
        raise InputError(f"{sweep_dir} holds a sweep over {', '.join(record['keys'])}, not "
                         f"{', '.join(keys)}: a grid grows by values and seeds, not by parameters; "
                         "sweep into a new --out", str(spec_path))
    before = {p["name"]: p for p in (record or {}).get("points", [])}
    points = name_points(expand(playbook.sweep, playbook.seed),
                         {json.dumps([p["params"], p["seed"]], sort_keys=True): n for n, p in before.items()})
    defined, changed = [], []
    for p in points:
        playbook_text = yaml.safe_dump(point_playbook(playbook, p), sort_keys=False)
        profile = None if physical else point_profile(bench, p)
        profile_text = None if profile is None else yaml.safe_dump(profile, sort_keys=False)
        entry = {"name": p.name, "params": rec.to_jsonable(p.params), "seed": p.seed, "bench": bench,
                 "playbook_sha256": _sha256(playbook_text), "profile_sha256": _sha256(profile_text)}
        old = before.get(p.name)
        if old is not None and old != entry and (sweep_dir / "points" / p.name).exists():
            differs = [k.removesuffix("_sha256") for k in ("playbook_sha256", "profile_sha256", "bench")
                       if old.get(k) != entry[k]]
            changed.append(f"{p.name} ({', '.join(differs)})")
        defined.append((p, entry, playbook_text, profile_text))
    if changed:
        raise InputError(f"{sweep_dir}: {len(changed)} point(s) already started would now be defined differently: "
                         f"{'; '.join(changed[:5])}{' …' if len(changed) > 5 else ''}; resume them unchanged, or "
                         "sweep into a new --out", str(spec_path))
    inputs = sweep_dir / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    jobs, entries = [], dict(before)
    for p, entry, playbook_text, profile_text in defined:
        entries[p.name] = entry
        pb_path = inputs / f"{p.name}.playbook.yaml"
        _write_if_new(pb_path, playbook_text)
        point_bench = bench
        if profile_text is not None:
            prof_path = inputs / f"{p.name}.profile.yaml"
            _write_if_new(prof_path, profile_text)
            _check_profile(prof_path, p)
            point_bench = _with_profile(bench, prof_path)
        jobs.append(PointJob(p.name, str(sweep_dir / "points" / p.name), str(pb_path), point_bench, p.seed,
                             physical, lease_wait_s))
    rec.write_json_atomic(spec_path, {"format": SPEC_FORMAT, "playbook": playbook.name, "keys": keys,
                                      "points": list(entries.values())})
    return SweepPlan(sweep_dir, points, jobs, physical)


def _sha256(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


def _write_if_new(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        rec.write_text_atomic(path, text)


def _check_profile(path: Path, point: Point) -> None:
    from devices.emulated import profile

    try:
        profile.load_profile(str(path))
    except profile.ProfileError as exc:
        keys = ", ".join(k for k in point.params if k.startswith("profile."))
        raise InputError(f"sweep.grid ({keys} = {[point.params[k] for k in point.params if k.startswith('profile.')]}): "
                         f"{exc}") from None


def execute(sweep: SweepPlan, *, scheduler: str | None, workers: int, serial: bool, quiet: bool) -> list[dict]:
    """Run every job; serially in this process, or on a dask cluster (physical points chained)."""
    from rich.progress import Progress

    from harness import logs

    todo = [j for j in sweep.jobs if not _finished(Path(j.run_dir))]
    done = [{"point": j.name, "exit_code": _json(Path(j.run_dir) / "point.json").get("exit_code"), "ran": False}
            for j in sweep.jobs if j not in todo]
    with Progress(disable=quiet, transient=False, console=logs.console()) as bar:
        task = bar.add_task(f"sweep: {len(todo)} to run, {len(done)} finished", total=len(sweep.jobs),
                            completed=len(done))
        if serial or not todo:
            for job in todo:
                done.append(run_point(job))
                bar.advance(task)
            return done
        from distributed import as_completed

        with _client(scheduler, workers) as client:
            futures, previous = [], None
            for job in todo:
                after = previous if job.physical else None
                future = client.submit(run_point, job, after, key=f"point-{job.name}-{os.getpid()}", pure=False)
                previous = future if job.physical else previous
                futures.append(future)
            for future in as_completed(futures):
                done.append(future.result())
                bar.advance(task)
    return done


def _client(scheduler: str | None, workers: int):
    from distributed import Client, LocalCluster

    if scheduler:
        try:
            return Client(scheduler, timeout="20s")
        except OSError as exc:  # includes the connect timeout
            raise InputError(f"--scheduler: cannot reach it ({exc}); the sweep resumes once it can",
                             scheduler) from None
    # Each point is its own `harness run` process, so the workers are threads: no second copy of the harness.
    # dashboard_address=None would still serve the scheduler's HTTP routes on every interface, port 8787, and
    # each worker serves its own unless told where: all on loopback (a `--scheduler` decides for itself)
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                           dashboard_address="127.0.0.1:0", worker_dashboard_address="127.0.0.1:0")
    return _Closing(Client(cluster), cluster)


class _Closing:
    def __init__(self, client, cluster):
        self.client, self.cluster = client, cluster

    def __enter__(self):
        return self.client

    def __exit__(self, *exc):
        self.client.close()
        self.cluster.close()


def gather(sweep: SweepPlan, outcomes: list[dict]) -> "Any":
    """results.parquet: one row per finished point, parameters first."""
    import pandas as pd

    exit_of = {o["point"]: o.get("exit_code") for o in outcomes}
    rows = [result_row(p, Path(j.run_dir), exit_of.get(p.name)) for p, j in zip(sweep.points, sweep.jobs)
            if _finished(Path(j.run_dir))]
    frame = pd.DataFrame(rows)
    tmp = sweep.sweep_dir / f".{RESULTS_NAME}.tmp"
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, sweep.sweep_dir / RESULTS_NAME)
    return frame
