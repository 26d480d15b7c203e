"""Clock soak: one long turnaround run on the emulated bench; cycle period early and late, RSS and threads.

A clock fit that grows with the run shows as a cycle period rising with the cycle number; a race between
the per-cycle clock check and the background sync ends the run in a traceback. Run it niced, once:

    nice -n 10 .venv/bin/python benchmarks/clock_soak.py [--cycles 5000] [--profile instant]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]


def proc_status(pid: int) -> tuple[int, int] | None:
    """(RSS in KiB, threads) of a live process, from /proc."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["Threads"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=5000)
    parser.add_argument("--profile", default="instant")
    parser.add_argument("--window", type=int, default=50, help="cycles averaged around each checkpoint")
    parser.add_argument("--cycle-timeout", type=float, default=1.0,
                        help="cycle_timeout_s (a cycle that loses an event waits this long, not 30 s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        out = Path(tmp) / "run"
        playbook = yaml.safe_load((ROOT / "playbooks/turnaround.yaml").read_text())
        playbook["bench"] = f"emulated:{args.profile}"
        playbook["steps"][0]["cycle_timeout_s"] = args.cycle_timeout
        (Path(tmp) / "soak.yaml").write_text(yaml.safe_dump(playbook))
        cmd = [sys.executable, "-m", "harness", "run", str(Path(tmp) / "soak.yaml"), "-q",
               "--bench", f"emulated:{args.profile}", "--cycles", str(args.cycles), "--out", str(out)]
        proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        samples = []
        while proc.poll() is None:
            status = proc_status(proc.pid)
            if status:
                samples.append((time.monotonic(), *status))
            time.sleep(1.0)
        stderr = proc.stderr.read()
        run_dir = out
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
        cycles = pd.read_parquet(run_dir / "cycles.parquet").sort_values("cycle")
        period_ms = np.diff(cycles["begin_ns"].to_numpy()) / 1e6
        n = len(period_ms)

        def around(k: int) -> str:
            part = period_ms[max(0, min(k, n) - args.window):min(k, n)]
            return f"median {np.median(part):.1f} ms, p90 {np.percentile(part, 90):.1f} ms"

        rss = [s[1] for s in samples]
        threads = [s[2] for s in samples]
        ok = int((cycles["status"] == "ok").sum()) if "status" in cycles else len(cycles)
        print(f"exit {proc.returncode}, outcome {summary.get('outcome')}, {len(cycles)} cycles recorded, {ok} ok")
        print(f"cycle period at cycle 100: {around(100)}; at cycle {args.cycles}: {around(n)}")
        if samples:
            third = max(1, len(rss) // 3)
            print(f"RSS MiB: first third max {max(rss[:third]) / 1024:.0f}, last third max "
                  f"{max(rss[-third:]) / 1024:.0f}; threads min {min(threads)} max {max(threads)} "
                  f"(first {threads[0]}, last {threads[-1]})")
        if "Traceback" in stderr:
            print("TRACEBACK:\n" + stderr[-3000:])
            return 1
    return 0 if proc.returncode in (0, 1) else 1  # 1: a check failed (a cycle timed out), not a crash


if __name__ == "__main__":
    sys.exit(main())
