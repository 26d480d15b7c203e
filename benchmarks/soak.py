"""Memory soak: one turnaround campaign of N cycles on `emulated:instant`; RSS and cycle period per step of
cycles, then how long writing the record took and the run's peak RSS.

The harness runs as a child process; its cycle count is read from events.jsonl as it grows (each cycle's
`ocs_command_sent` line), its RSS from /proc, its peak RSS from the kernel when it exits (wait4). The record's
writing time runs from the last cycle's events to the process's exit (teardown included). Run it niced:

    nice -n 10 .venv/bin/python benchmarks/soak.py --cycles 100000 [--step 10000]

`--root DIR` runs the harness of another checkout (its own interpreter: `DIR/.venv/bin/python`), to compare.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
_SENT = re.compile(rb'"cycle":(\d+),"stage":"ocs_command_sent"')


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class CycleCounter:
    """The last cycle whose command events.jsonl records, read incrementally (whole lines only)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.last = path, 0, 0

    def poll(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.last
        whole = data.rfind(b"\n") + 1
        self.offset += whole
        for match in _SENT.finditer(data[:whole]):
            self.last = max(self.last, int(match.group(1)))
        return self.last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=100_000)
    parser.add_argument("--step", type=int, default=10_000, help="cycles per table row")
    parser.add_argument("--profile", default="instant")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose harness runs")
    parser.add_argument("--keep", type=Path, help="keep the run directory here (default: a temporary one)")
    args = parser.parse_args()
    if args.cycles < 1 or args.step < 1:
        parser.error("--cycles and --step must be ≥ 1")
    python = args.root / ".venv/bin/python"
    python = str(python) if python.exists() else sys.executable
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        out = args.keep or Path(tmp) / "run"
        playbook = yaml.safe_load((args.root / "playbooks/turnaround.yaml").read_text())
        playbook["bench"] = f"emulated:{args.profile}"
        playbook["steps"][0]["cycle_timeout_s"] = 2.0  # a cycle that loses an event waits 2 s, not 30
        (Path(tmp) / "soak.yaml").write_text(yaml.safe_dump(playbook))
        cmd = [python, "-m", "harness", "run", str(Path(tmp) / "soak.yaml"), "-q", "--bench",
               f"emulated:{args.profile}", "--cycles", str(args.cycles), "--out", str(out)]
        print(f"$ {' '.join(cmd)}  (load {os.getloadavg()[0]:.1f})", flush=True)
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=args.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        counter = CycleCounter(out / "events.jsonl")
        print(f"{'cycles':>8} {'elapsed s':>10} {'RSS MiB':>8} {'period ms':>10} {'load':>5}", flush=True)
        mark, mark_t, cycles_done_t, peak_seen = 0, started, None, 0.0
        status = rusage = None
        while True:
            pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            now, cycle, rss = time.monotonic(), counter.poll(), rss_mib(proc.pid)
            peak_seen = max(peak_seen, rss or 0.0)
            if cycle >= mark + args.step or (cycle == args.cycles and cycle > mark):
                if mark:  # the first row's period includes the bench's start
                    period = (now - mark_t) / (cycle - mark) * 1e3
                    print(f"{cycle:>8} {now - started:>10.0f} {rss or 0:>8.0f} {period:>10.2f} "
                          f"{os.getloadavg()[0]:>5.1f}", flush=True)
                else:
                    print(f"{cycle:>8} {now - started:>10.0f} {rss or 0:>8.0f} {'':>10} {os.getloadavg()[0]:>5.1f}",
                          flush=True)
                mark, mark_t = cycle, now
            if cycle == args.cycles and cycles_done_t is None:
                cycles_done_t = now
            time.sleep(0.5)
        ended = time.monotonic()
        stderr = proc.stderr.read().decode(errors="replace")
        code = os.waitstatus_to_exitcode(status)
        print(f"\nexit code {code}; {counter.poll()} cycles in {(cycles_done_t or ended) - started:.0f} s")
        if cycles_done_t is not None:
            print(f"record written (last cycle → exit, teardown included): {ended - cycles_done_t:.1f} s")
        print(f"peak RSS (kernel, wait4): {rusage.ru_maxrss / 1024:.0f} MiB; highest sampled: {peak_seen:.0f} MiB")
        if code:
            print(stderr[-3000:], file=sys.stderr)
        return code


if __name__ == "__main__":
    raise SystemExit(main())
