"""How the harness scales with hosts: an emulated pod (hosts × NICs per host as parameters), one
reconfiguration of every port, measured against the emulator's ground truth (issue 13 item 2).

The emulator (`harness emulate`, built from a generated profile; `--workers N` serves the hosts' SSH from N
processes over its one physics) and the harness (`harness run`) run as separate processes, as on a bench, so
each one's CPU, memory, threads and descriptors are its own (the emulator's summed over its workers). Per host
count:
- set-up: harness start → first cross-connect command (imports, inventory, SSH, agents, clocks, readers);
- harness CPU seconds (user+sys), peak RSS, peak threads and descriptors (sampled from /proc); threads also
  after set-up (from the first physical effect on: set-up's bounded pool of host openers has ended);
- event latency: harness time an observation arrived − the true time of the physical event, p50/p99;
- lost events: true port events of the measured cycle without a recorded event; bounds that contain the
  truth (each recorded event's ± uncertainty around its true time);
- verdict: pass iff no event was lost and every bound holds its truth (the exit status; speed is reported,
  never judged: the machine may be shared);
- the machine's 1-min load average at the start and end (the machine may be shared).

    nice -n 10 .venv/bin/python benchmarks/scale.py --hosts 8 32 64 128 256 --nics 8 --workers 2 [--timeout 900]
        [--json out.jsonl] [--py-spy DIR]

A Markdown table of the rows ends the output.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.accuracy import assign_cycles, match, unrecorded, watched_truth  # noqa: E402
from analysis.stages import PORT_CHAIN, STAGE_TABLE, STAGES_DOWN  # noqa: E402
from harness.events import STAGES  # noqa: E402

PORT_STAGES = tuple(s for s in PORT_CHAIN if s != "first_packet") + STAGES_DOWN  # what the watch reports


def write_profile(out: Path, hosts: int, nics: int, base: str) -> Path:
    """The base profile's delays with the topology asked for (one N×N switch carrying every NIC)."""
    from devices.emulated.profile import load_profile

    data = yaml.safe_load(Path(load_profile(base).path).read_text())
    ports = hosts * nics
    data["name"] = f"scale-{hosts}x{nics}"
    data["topology"] = {"hosts": hosts, "nics_per_host": nics, "ocs_size": [ports, ports]}
    path = out / "profile.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (the emulator's host workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            pass
    return out


class Sampler:
    """Peak RSS, threads and open descriptors of a process and its children (summed), from /proc every
    `period_s`; `timeline` keeps (CLOCK_MONOTONIC ns, threads) of every sample."""

    def __init__(self, pid: int, period_s: float = 0.2):
        self.pid, self.period_s = pid, period_s
        self.rss_mb = self.threads = self.fds = 0
        self.timeline: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            rss_kb = threads = fds = 0
            for pid in process_tree(self.pid):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    fds += len(os.listdir(f"/proc/{pid}/fd"))
                except OSError:
                    continue
                fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                if "VmRSS" in fields:  # not yet exited
                    rss_kb += int(fields["VmRSS"].split()[0])
                    threads += int(fields["Threads"])
            if not rss_kb:
                return
            self.rss_mb = max(self.rss_mb, rss_kb / 1024)
            self.timeline.append((time.monotonic_ns(), threads))
            self.threads = max(self.threads, threads)
            self.fds = max(self.fds, fds)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and its live children."""
    ticks, total = os.sysconf("SC_CLK_TCK"), 0
    for p in process_tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / ticks


def live_cpu_s(pid: int) -> float | None:
    """`cpu_s` of a process still running; None once it has ended (or without /proc)."""
    return cpu_s(pid) if Path(f"/proc/{pid}/stat").exists() else None


def py_spy(pid: int, out: Path | None, name: str) -> subprocess.Popen | None:
    """Sample `pid` with py-spy until it exits (`--py-spy DIR`: DIR/NAME-HOSTS.txt, folded stacks, GIL
    holders only, so the counts are where the process spends its interpreter)."""
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    exe = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    return subprocess.Popen([exe or "py-spy", "record", "-p", str(pid), "-r", "100", "--gil", "--nonblocking", "--subprocesses", "-f", "raw", "-o",
                             str(out / f"{name}.txt")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_one(hosts: int, nics: int, base: str, timeout_s: float, probes: bool, workdir: Path,
            profile_dir: Path | None = None, workers: int = 0) -> dict:
    load_before = os.getloadavg()[0]
    profile = write_profile(workdir, hosts, nics, base)
    inventory, truth_file = workdir / "bench.yaml", workdir / "truth.jsonl"
    env = dict(os.environ, OCS_HIL_EMULATED_PASSWORD="root", OCS_HIL_LOCK_DIR=str(workdir / "locks"))
    emulator = subprocess.Popen([sys.executable, "-m", "harness", "emulate", "--profile", str(profile), "--seed", "13",
                                 "--inventory-out", str(inventory), "--truth-out", str(truth_file), "--workers", str(workers)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    spies = [py_spy(emulator.pid, profile_dir, f"emulator-{hosts}")]
    result: dict = {"hosts": hosts, "nics": nics, "ports": hosts * nics, "workers": workers,
                    "load_before": load_before}
    try:
        end = time.monotonic() + timeout_s
        while not inventory.exists():
            if emulator.poll() is not None or time.monotonic() > end:
                raise SystemExit(f"emulator did not start: {emulator.stderr.read().decode()[-500:]}")
            time.sleep(0.1)
        result["emulator_start_s"] = round(timeout_s - (end - time.monotonic()), 1)
        playbook = workdir / "scale.yaml"
        playbook.write_text(json.dumps({
            "name": "scale", "bench": str(inventory), "seed": 13, "cycles": 1,
            "steps": [{"type": "turnaround", "name": "all-ports", "pattern": "ring-shift", "probes": probes,
                       "cycle_timeout_s": 120}]}))
        emu_sampler = Sampler(emulator.pid, 1.0)
        start_ns = time.monotonic_ns()
        harness = subprocess.Popen([sys.executable, "-m", "harness", "run", str(playbook), "--out",
                                    str(workdir / "run"), "-q"], cwd=ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        sampler = Sampler(harness.pid)
        spies.append(py_spy(harness.pid, profile_dir, f"harness-{hosts}"))
        try:
            _, status, usage = os.wait4(harness.pid, 0) if _wait(harness, timeout_s) else (0, -1, None)
        finally:
            sampler.stop()
            emu_sampler.stop()
        output = harness.stdout.read().decode(errors="replace")
        if usage is None:
            result.update(status="timeout", wall_s=timeout_s)
            return result
        wall_s = (time.monotonic_ns() - start_ns) / 1e9
        result.update(status=f"exit {os.waitstatus_to_exitcode(status)}", wall_s=round(wall_s, 1),
                      harness_cpu_s=round(usage.ru_utime + usage.ru_stime, 1),
                      harness_sys_s=round(usage.ru_stime, 1), harness_rss_mb=round(usage.ru_maxrss / 1024),
                      harness_threads=sampler.threads, harness_fds=sampler.fds,
                      emulator_cpu_s=round(cpu_s(emulator.pid), 1), emulator_rss_mb=round(emu_sampler.rss_mb),
                      emulator_threads=emu_sampler.threads)
        if os.waitstatus_to_exitcode(status) != 0:
            result["output"] = output[-1500:]
    finally:
        emulator.send_signal(signal.SIGINT)
        try:
            emulator.wait(timeout=120)
        except subprocess.TimeoutExpired:
            emulator.kill()
            emulator.wait()
        for spy in filter(None, spies):
            spy.wait(timeout=60)
    result["load_after"] = os.getloadavg()[0]
    result.update(compare(workdir / "run", truth_file, start_ns))
    if "setup_s" in result and "harness_threads" in result:  # set-up's pool gone: what the run keeps
        setup_end = start_ns + result["setup_s"] * 1e9
        result["harness_threads_after_setup"] = max((n for t, n in sampler.timeline if t >= setup_end), default=None)
        result["emulator_threads_after_setup"] = max((n for t, n in emu_sampler.timeline if t >= setup_end),
                                                     default=None)
    return result


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for the child without reaping it (os.wait4 reaps it and gives its rusage)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    return False


def compare(run_dir: Path, truth_file: Path, start_ns: int) -> dict:
    """Set-up time, lost events and event latency against the ground truth."""
    if not truth_file.exists():
        return {"truth": "missing (the emulator did not write it)"}
    rows = [json.loads(line) for line in truth_file.read_text().splitlines()]
    truth = pd.DataFrame([r for r in rows if r["stage"] in STAGES])
    out: dict = {}
    if truth.empty:
        return out
    out["setup_s"] = round((truth["t_ns"].min() - start_ns) / 1e9, 2)  # first physical effect of a command
    cycles = pd.read_parquet(run_dir / "cycles.parquet") if (run_dir / "cycles.parquet").exists() else pd.DataFrame()
    if cycles.empty:
        return out
    out["cycle_status"] = ",".join(cycles["status"].astype(str))
    out["cycle_ms"] = round(float((cycles["done_ns"] - cycles["sent_ns"]).max() / 1e6), 1)
    truth = assign_cycles(truth, list(zip(cycles["cycle"], cycles["begin_ns"])))
    done = cycles.set_index("cycle")["done_ns"]
    truth = truth[truth["stage"].isin(PORT_STAGES) & (truth["t_ns"] <= truth["cycle"].map(done))]  # not the restore
    events = pd.read_parquet(run_dir / "events.parquet")
    events = events[events["cycle"].isin(cycles["cycle"]) & events["stage"].isin(PORT_STAGES)]
    watched = watched_truth(truth, done.to_dict())
    out["true_events"] = int(len(watched))
    out["lost_events"] = int(len(unrecorded(events, watched)))
    matched = match(events, truth)  # each recorded event's bound (± uncertainty) against the true time
    out["bounds_contain_truth"] = f"{int(matched['covered'].sum())}/{len(matched)}"
    out["verdict"] = "pass" if out["lost_events"] == 0 and bool(matched["covered"].all()) else "FAIL"
    latency = observation_latency(run_dir, truth)
    if latency.size:
        out["latency_p50_ms"] = round(float(np.quantile(latency, 0.5)), 2)
        out["latency_p99_ms"] = round(float(np.quantile(latency, 0.99)), 2)
    return out


def observation_latency(run_dir: Path, truth: pd.DataFrame) -> np.ndarray:
    """Per true port event: the first watch observation of its field/value after it arrived (recv_ns) − t_ns."""
    path = run_dir / "observations.jsonl"
    if not path.exists():
        return np.array([])
    obs = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("k") == "obs" and r.get("kind") == "watch":
            obs.append(r)
    if not obs:
        return np.array([])
    obs = pd.DataFrame(obs)
    out = []
    watch_of = {s.name: s.watch for s in STAGE_TABLE if s.watch}
    for stage, g in truth.groupby("stage"):
        if stage not in watch_of:
            continue
        field, value = watch_of[stage]
        seen = obs[(obs["field"] == field) & (obs["value"].astype(str) == str(value))]
        for (host, netdev), t in g.groupby(["host", "port"])["t_ns"]:
            arrivals = np.sort(seen[(seen["host"] == host) & (seen["netdev"] == netdev)]["recv_ns"].to_numpy())
            for t_ns in t:
                i = np.searchsorted(arrivals, t_ns)
                if i < arrivals.size:
                    out.append((arrivals[i] - t_ns) / 1e6)
    return np.array(out)


COLUMNS = [("hosts×NICs", lambda r: f"{r['hosts']}×{r['nics']}"), ("workers", lambda r: r["workers"]),
           ("load 1-min", lambda r: f"{r['load_before']:.1f}–{r.get('load_after', float('nan')):.1f}"),
           ("set-up s", "setup_s"), ("harness CPU s (sys)", lambda r: f"{r.get('harness_cpu_s')} ({r.get('harness_sys_s')})"),
           ("harness RSS MB", "harness_rss_mb"),
           ("harness threads peak / after set-up", lambda r: f"{r.get('harness_threads')} / {r.get('harness_threads_after_setup')}"),
           ("harness FDs", "harness_fds"), ("emulator CPU s", "emulator_cpu_s"), ("emulator RSS MB", "emulator_rss_mb"),
           ("emulator threads peak / after set-up",
            lambda r: f"{r.get('emulator_threads')} / {r.get('emulator_threads_after_setup')}"), ("cycle ms", "cycle_ms"),
           ("latency p50/p99 ms", lambda r: f"{r.get('latency_p50_ms')} / {r.get('latency_p99_ms')}"),
           ("lost/true", lambda r: f"{r.get('lost_events')}/{r.get('true_events')}"),
           ("bounds hold truth", "bounds_contain_truth"), ("verdict", "verdict")]


def markdown_table(rows: list[dict]) -> str:
    def cell(r, how):
        return str(how(r) if callable(how) else r.get(how, "–"))

    lines = ["| " + " | ".join(name for name, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r, how) for _, how in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--nics", type=int, default=8, help="NIC ports per host")
    ap.add_argument("--profile", default="burst-mode", help="profile whose delays the pod uses")
    ap.add_argument("--probes", action="store_true", help="also run the first-packet probes (2 streams per port)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per host count")
    ap.add_argument("--json", help="append each result as a JSON line here")
    ap.add_argument("--workers", type=int, default=0, help="emulator host worker processes (0: one process)")
    ap.add_argument("--py-spy", type=Path, help="profile both processes with py-spy into this folder")
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),) * 2)
    failed, rows = 0, []
    for n in args.hosts:
        with tempfile.TemporaryDirectory(prefix="ocs-hil-scale-") as tmp:
            r = run_one(n, args.nics, args.profile, args.timeout, args.probes, Path(tmp), args.py_spy, args.workers)
        r.setdefault("verdict", "FAIL")  # no measured cycle: nothing shows the events were kept
        failed += r["verdict"] != "pass"
        rows.append(r)
        print(json.dumps(r), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(r) + "\n")
    print(markdown_table(rows))
    raise SystemExit(1 if failed else 0)  # pass = every true event recorded, every bound holds its truth
