"""`harness profile fit RUN_DIR... --out PROFILE.yaml`: fit an emulator timing profile to measured runs."""
from __future__ import annotations

from harness.commands import SEED, number

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.stages import NIC_PROFILE_KEYS
from harness.errors import InputError

if TYPE_CHECKING:  # annotations only: pandas is imported where a command runs
    import pandas as pd

# profile key -> chain column of analysis.stats.stage_table (later stage − earlier stage)
NIC_KEYS = {key: f"chain_{key}" for key in NIC_PROFILE_KEYS}


def load_run_events(run_dir: Path) -> pd.DataFrame:
    """events.parquet, or the events rebuilt from events.jsonl when the run did not finish."""
    from harness.eventlog import read_events, read_parquet_events  # pandas: not at CLI start-up

    parquet, jsonl = run_dir / "events.parquet", run_dir / "events.jsonl"
    if parquet.is_file():
        return read_parquet_events(parquet)
    if jsonl.is_file():
        return read_events(jsonl)
    if not run_dir.is_dir():
        raise InputError("no such run directory", str(run_dir))
    raise InputError("no events.parquet or events.jsonl in this run directory", str(run_dir))


def combined_events(run_dirs: list[Path]) -> pd.DataFrame:
    """All runs' events; cycles are renumbered so that cycles of different runs never merge."""
    import pandas as pd  # here, not at the top: every `harness` start-up imports this module to register it

    frames = []
    for i, run_dir in enumerate(run_dirs):
        frame = load_run_events(run_dir).copy()
        frame["run_index"] = i
        frames.append(frame)
    events = pd.concat(frames, ignore_index=True)
    events["cycle"] = pd.factorize(pd.MultiIndex.from_arrays([events["run_index"], events["cycle"]]))[0]
    return events


def fit_profile(events: pd.DataFrame, *, seed: int = 0, alpha_ports: float = 0.01,
                base: dict | None = None) -> tuple[dict, dict]:
    """(profile mapping, fit report). Keys without samples come from `base` (a profile mapping)."""
    import numpy as np  # scipy (analysis.fit) and numpy only when a fit runs, not at every CLI start-up

    from analysis.fit import fit_delay, ports_differ
    from analysis.stats import ocs_switch_times, stage_table

    base = base or {}
    report: dict = {"ocs": {}, "nic": {}, "per_port": {}, "port_tests": {}, "from_base": []}
    profile: dict = {"ocs": dict(base.get("ocs") or {}), "nic": dict(base.get("nic") or {}), "per_port": {}}
    switch_ms = ocs_switch_times(events).to_numpy() * 1e-6
    if switch_ms.size:
        fit = fit_delay(switch_ms, seed)
        profile["ocs"]["switch"] = fit.spec
        report["ocs"]["switch"] = fit.to_dict()
    else:
        report["from_base"].append("ocs.switch")
    table = stage_table(events)
    port_keys = [f"{h}:{p}" for _, h, p in table.index] if len(table) else []
    for i, (key, column) in enumerate(NIC_KEYS.items(), start=1):
        values = table[column].to_numpy() * 1e-6 if len(table) else np.array([])
        finite = np.isfinite(values)
        if not finite.any():
            report["from_base"].append(f"nic.{key}")
            continue
        fit = fit_delay(values[finite], seed + i, cycles=table.index.get_level_values("cycle")[finite])
        profile["nic"][key] = fit.spec
        report["nic"][key] = fit.to_dict()
        groups: dict[str, list[float]] = {}
        for port, value in zip(port_keys, values):
            if np.isfinite(value):
                groups.setdefault(port, []).append(value)
        differ, p = ports_differ({k: np.asarray(v) for k, v in groups.items()}, alpha_ports)
        report["port_tests"][key] = {"kruskal_p": p, "per_port": differ, "ports": len(groups)}
        if differ:
            for j, (port, samples) in enumerate(sorted(groups.items())):
                port_fit = fit_delay(samples, seed + 1000 * i + j)
                profile["per_port"].setdefault(port, {})[key] = port_fit.spec
                report["per_port"].setdefault(port, {})[key] = port_fit.to_dict()
    for section in ("hosts", "topology"):
        if section in base:
            profile[section] = base[section]
    if "topology" not in profile and len(table):
        hosts = sorted({h for _, h, _ in table.index})
        per_host = max(len({p for _, h2, p in table.index if h2 == h}) for h in hosts)
        size = max(16, len(hosts) * per_host)
        profile["topology"] = {"hosts": len(hosts), "nics_per_host": per_host, "ocs_size": [size, size]}
    if not profile["per_port"]:
        del profile["per_port"]
    return profile, report


def _base_profile(name_or_path: str | None) -> dict:
    if not name_or_path:
        return {}
    from harness.bench.emulated import load_profile

    loaded = load_profile(name_or_path)
    return {"ocs": {k: dict(d.spec) for k, d in loaded.ocs.items()},
            "nic": {k: dict(d.spec) for k, d in loaded.nic.items()},
            "hosts": {"clock_offset_ms": list(loaded.clock_offset_ms), "drift_ppm": list(loaded.drift_ppm)},
            "topology": {"hosts": loaded.topology.hosts, "nics_per_host": loaded.topology.nics_per_host,
                         "ocs_size": list(loaded.topology.ocs_size)}}


def run_fit(args: argparse.Namespace) -> int:
    import yaml

    from devices.emulated.profile import ProfileError, profile_from_dict
    from harness.record import write_json_atomic, write_text_atomic

    run_dirs = [Path(p) for p in args.runs]
    events = combined_events(run_dirs)
    if events.empty:
        raise InputError("the runs contain no events", str(run_dirs[0]))
    base = _base_profile(args.base)
    body, report = fit_profile(events, seed=args.seed, alpha_ports=args.alpha_ports, base=base)
    out = Path(args.out)
    cycles = int(events["cycle"].nunique())
    profile = {"name": args.name or out.stem,
               "description": f"Fitted to {cycles} cycles from {len(run_dirs)} run(s) by `harness profile fit`.",
               "source": "runs: " + ", ".join(p.name for p in run_dirs)
                         + (f"; unmeasured keys from {args.base}" if args.base else ""),
               **body}
    try:
        profile_from_dict(profile, str(out))  # what the emulator will do with it
    except ProfileError as exc:
        raise InputError(f"fitted profile is not loadable: {exc}", str(out)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, yaml.safe_dump(profile, sort_keys=False, default_flow_style=None, width=110))
    report_path = out.with_name(out.name + ".fit.json")
    write_json_atomic(report_path, {"runs": [str(p) for p in run_dirs], "cycles": cycles, **report})
    for section in ("ocs", "nic"):
        for key, fit in report[section].items():
            ci = ", ".join(f"{k} {v[0]:g}..{v[1]:g}" for k, v in fit["ci95"].items()
                           if k in ("mean_ms", "p99_ms", "cv", "p50_ms"))
            print(f"{section}.{key}: {fit['choice']} n={fit['n']} {json.dumps(fit['spec'])}"
                  + (f" (95% CI {ci})" if ci else ""))
    for port, keys in report["per_port"].items():
        choices = ", ".join(f"{k} {v['choice']}" for k, v in keys.items())
        print(f"per_port {port}: {choices}")
    if report["from_base"]:
        print(f"not measured (base/defaults kept): {', '.join(report['from_base'])}")
    print(f"wrote {out} and {report_path}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("profile", help="timing profiles from measured runs",
                                   description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="profile_command", metavar="ACTION", parser_class=type(parser))
    sub.required = True
    fit = sub.add_parser("fit", help="fit delay distributions to one or more run directories")
    fit.add_argument("runs", nargs="+", metavar="RUN_DIR")
    fit.add_argument("--out", required=True, metavar="PROFILE.yaml")
    fit.add_argument("--name", help="profile name (default: the output file's stem)")
    fit.add_argument("--base", help="profile (name or file) for keys the runs do not measure, e.g. ocs.dark")
    fit.add_argument("--seed", type=SEED, default=0, help="bootstrap seed (default 0)")
    fit.add_argument("--alpha-ports", type=number(0, 1, above=True), default=0.01,
                     help="Kruskal–Wallis level for per-port overrides (default 0.01)")
    fit.set_defaults(func=run_fit)
