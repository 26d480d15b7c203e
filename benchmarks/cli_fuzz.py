"""Command-line argument fuzz: `harness` sub-commands given hostile arguments, each case its own process
under a time bound and an address-space limit; outcomes counted by exit code. Every case must end with exit
0, 1 or 2 and no traceback: a traceback, a hang (the time bound) or an out-of-memory (the limit) is counted
apart and printed.

Cases: one argument of a valid command line replaced by a hostile value (non-finite, negative, zero, huge,
fractional, not a number, empty, very long), or an input file replaced by a device, a FIFO, a directory, a
missing, binary, empty or huge file. Commands: run --dry-run, validate, bench restore, ocs (against a closed
port), traces inspect/generate/convert, schema.

    nice -n 10 .venv/bin/python benchmarks/cli_fuzz.py [--count 150] [--seed 1] [--jobs 2]
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = ["nan", "inf", "-inf", "-1", "0", "1e308", str(10**20), "1.5", "abc", "", "0x10", "9" * 400,
           "-9223372036854775809", "1e-320"]
TIME_LIMIT_S = 60
MEMORY_LIMIT = 3 * 2**30


def files(work: Path) -> list[str]:
    fifo = work / "fifo.yaml"
    os.mkfifo(fifo)
    (work / "empty.yaml").write_text("")
    (work / "binary.yaml").write_bytes(bytes(range(256)) * 64)
    (work / "huge.yaml").write_bytes(b"a: " + b"x" * (8 * 2**20) + b"\n")
    (work / "dir.yaml").mkdir()
    return ["/dev/zero", "/dev/urandom", str(fifo), str(work / "empty.yaml"), str(work / "binary.yaml"),
            str(work / "huge.yaml"), str(work / "dir.yaml"), str(work / "missing.yaml")]


def templates(work: Path) -> list[list[str]]:
    """Valid command lines (each value a candidate for replacement); none runs for long when valid."""
    pb = str(ROOT / "playbooks" / "turnaround.yaml")
    trace = work / "t.parquet"
    return [
        ["run", pb, "--dry-run", "--cycles", "3", "--seed", "4", "-q"],
        ["run", pb, "--dry-run", "--bench", "emulated:instant", "-q"],
        ["validate", pb],
        ["validate", str(ROOT / "devices" / "profiles" / "instant.yaml")],
        ["bench", "restore", str(work), "--timeout", "2"],
        ["ocs", "--protocol", "polatis-tl1", "--url", "tcp://127.0.0.1:9", "--timeout", "1", "--size", "8x8", "list"],
        ["ocs", "--protocol", "polatis-netconf", "--url", "ssh://127.0.0.1:9", "--timeout", "1", "list"],
        ["ocs", "--protocol", "polatis-scpi", "--url", "tcp://127.0.0.1:9", "--baudrate", "9600", "list"],
        ["traces", "generate", "poisson", "--out", str(trace), "--seed", "1", "--duration-s", "10", "--rate", "2"],
        ["traces", "generate", "diloco", "--out", str(trace), "--seed", "1", "--count", "3", "--window-s", "2"],
        ["traces", "inspect", str(trace), "--bin-s", "1"],
        ["traces", "convert", str(trace), str(work / "out.csv")],
        ["schema", "playbook"],
    ]


def cases(work: Path, count: int, rng: random.Random) -> list[list[str]]:
    bad_files = files(work)
    subprocess.run([sys.executable, "-m", "harness", "traces", "generate", "poisson", "--out",
                    str(work / "t.parquet"), "--seed", "1", "--duration-s", "10"], check=True, capture_output=True)
    out = []
    for i in range(count):
        argv = list(rng.choice(templates(work)))
        i = rng.randrange(1, len(argv))
        if argv[i].startswith("--") or argv[i] in ("-q", "list", "poisson", "diloco", "restore", "inspect",
                                                    "generate", "convert", "playbook"):
            i = min(i + 1, len(argv) - 1)
        looks_like_file = "/" in argv[i] or argv[i].endswith((".yaml", ".parquet", ".csv"))
        argv[i] = rng.choice(bad_files if looks_like_file and rng.random() < 0.8 else NUMBERS)
        out.append(argv)
    return out


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_case(argv: list[str], work: Path) -> tuple[str, str]:
    """One case in `work` (whatever it writes stays there), with the harness from this tree."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run([sys.executable, "-m", "harness", *argv], capture_output=True, text=True,
                              timeout=TIME_LIMIT_S, preexec_fn=_limit, cwd=work, stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired:
        return "HANG", " ".join(argv)
    if "MemoryError" in proc.stderr or proc.returncode in (-9, 137):
        return "OUT OF MEMORY", " ".join(argv)
    if "Traceback" in proc.stderr:
        return "TRACEBACK", f"{' '.join(argv)}\n{proc.stderr[-800:]}"
    return f"exit {proc.returncode}", ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=150)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--show", type=int, default=5)
    args = parser.parse_args()
    outcomes: collections.Counter = collections.Counter()
    by_command: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    bad: list[str] = []
    with tempfile.TemporaryDirectory(prefix="cli-fuzz-") as tmp:
        work = Path(tmp)
        argvs = cases(work, args.count, random.Random(args.seed))
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for argv, (outcome, detail) in zip(argvs, pool.map(lambda argv: run_case(argv, work), argvs)):
                outcomes[outcome] += 1
                by_command[" ".join(argv[:2] if argv[0] in ("traces", "bench") else argv[:1])][outcome] += 1
                if detail:
                    bad.append(f"{outcome}: {detail}")
    print(f"{args.count} fuzzed command lines (seed {args.seed}):",
          ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())))
    columns = sorted(outcomes)
    print("\n| command | cases | " + " | ".join(columns) + " |\n|---|---:|" + "---:|" * len(columns))
    for command, counts in sorted(by_command.items()):
        print(f"| {command} | {sum(counts.values())} | " + " | ".join(str(counts[c]) for c in columns) + " |")
    for line in bad[:args.show]:
        print("----\n" + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
