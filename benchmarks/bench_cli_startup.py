"""`harness --version` / `harness --help` start-up: wall time per fresh process, and what it imported.

    .venv/bin/python benchmarks/bench_cli_startup.py [--runs 20] [--json]

Each run is a fresh process of the installed `harness` console script (the one beside this interpreter), so
it counts the interpreter's own start, site-packages and every module the parser needs. Reports min / median /
max over the runs, a bare `python -c pass` beside it (the floor no import work can go under), the load
average at the time, and from one `python -X importtime` run the slowest top-level imports and whether
numpy, pandas, scipy or pydantic were loaded. Goal: median <= 150 ms for both (issue #40 item 4).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("numpy", "pandas", "pyarrow", "scipy", "matplotlib", "pydantic", "yaml", "paramiko")


def _command(args: list[str]) -> list[str]:
    script = Path(sys.executable).with_name("harness")
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "harness", *args]


def _times(cmd: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        out.append(time.perf_counter() - t)
    return out


def _imports(args: list[str]) -> tuple[list[tuple[int, str]], list[str]]:
    """(slowest top-level imports as (cumulative us, name), heavy packages loaded) of one -X importtime run."""
    code = f"import sys; sys.argv = ['harness', *{args!r}]; from harness.cli import main; sys.exit(main())"
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True).stderr
    top, loaded = [], set()
    for line in err.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _, cumulative, name = line.split("|")
        loaded.add(name.strip().split(".")[0])
        if not name[1:].startswith(" "):  # depth 0: imported by the CLI itself, not by another import
            top.append((int(cumulative), name.strip()))
    return sorted(top, reverse=True)[:8], sorted(loaded & set(HEAVY))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = {"load_before": os.getloadavg()}
    floor = _times([sys.executable, "-c", "pass"], a.runs)
    res["python -c pass"] = {"min_ms": min(floor) * 1e3, "median_ms": statistics.median(floor) * 1e3}
    for args in (["--version"], ["--help"]):
        t = _times(_command(args), a.runs)
        top, heavy = _imports(args)
        res[" ".join(["harness", *args])] = {
            "min_ms": min(t) * 1e3, "median_ms": statistics.median(t) * 1e3, "max_ms": max(t) * 1e3,
            "heavy_imports": heavy, "slowest_top_level_imports_ms": [(n, us / 1e3) for us, n in top]}
    res["load_after"] = os.getloadavg()
    if a.json:
        print(json.dumps(res, indent=1))
        return res
    print(f"{a.runs} fresh processes each; load average before {res['load_before'][0]:.2f}, "
          f"after {res['load_after'][0]:.2f} (1 min)")
    for name, r in res.items():
        if name.startswith("load"):
            continue
        line = f"{name:18s} min {r['min_ms']:7.1f} ms  median {r['median_ms']:7.1f} ms"
        if "max_ms" in r:
            line += f"  max {r['max_ms']:7.1f} ms  (goal: median <= 150 ms)  heavy: {', '.join(r['heavy_imports']) or 'none'}"
        print(line)
        for n, ms in r.get("slowest_top_level_imports_ms", []):
            print(f"    {ms:7.1f} ms  {n}")
    return res


if __name__ == "__main__":
    main()
