"""Issue 38, reproductions 8 and 9: bad command-line input and damaged trace files end in one clear line and
exit 2 — never a traceback, a hang or an out-of-memory. A device or FIFO as input runs as its own `harness`
process with a time bound, so a hang or an endless read fails the test instead of stalling it; the rest run
in this process."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from traces.schema import write_requests

PLAYBOOK = "name: p\nbench: emulated:instant\nsteps:\n  - {type: turnaround, probes: false}\n"


def harness(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONFAULTHANDLER": ""})


def refused(result: subprocess.CompletedProcess, said: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-1500:])
    assert "Traceback" not in result.stderr and said in result.stderr, result.stderr[-1500:]


def in_process(capsys, *args: str) -> subprocess.CompletedProcess:
    """`harness ARGS` in this process: its exit code (argparse's usage error included) and stderr."""
    from harness.cli import main

    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code
    return subprocess.CompletedProcess(args, code, "", capsys.readouterr().err)


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("args, said", [
    (["validate", "/dev/zero"], "not a regular file"),
    (["run", "/dev/zero", "--dry-run"], "not a regular file"),
    (["traces", "inspect", "/dev/zero"], "not a regular file"),
])
def test_a_device_is_never_read(args, said):
    refused(harness(*args, timeout=30), said)


@pytest.mark.parametrize("command", [["validate"], ["run", "--dry-run"], ["traces", "inspect"]])
def test_a_fifo_is_refused_not_waited_on(command, fifo):
    refused(harness(command[0], *command[1:], fifo, timeout=30), "not a regular file")


@pytest.mark.parametrize("args, said", [
    (["--cycles", str(10**20)], "--cycles: expected 1..10000000"),
    (["--cycles", "0"], "--cycles: expected 1..10000000"),
    (["--seed", "-1"], "--seed: expected 0..2**63-1"),
])
def test_numeric_run_arguments_are_range_checked(tmp_path, capsys, args, said):
    pb = tmp_path / "pb.yaml"
    pb.write_text(PLAYBOOK)
    refused(in_process(capsys, "run", str(pb), "--dry-run", *args), said)


@pytest.mark.parametrize("args, said", [
    (["bench", "restore", ".", "--timeout", "nan"], "argument --timeout: expected a finite number"),
    (["ocs", "--protocol", "polatis-tl1", "--url", "tcp://127.0.0.1:9", "--timeout", "inf", "list"], "--timeout"),
    (["sweep", "x.yaml", "--workers", "0"], "argument --workers"),
    (["traces", "generate", "poisson", "--out", "x.parquet", "--seed", "1", "--rate", "nan"], "argument --rate"),
    (["ocs", "--protocol", "polatis-netconf", "--url", "ssh://127.0.0.1:9", "list"], "give a user (harness ocs --user"),
])
def test_bad_arguments_are_one_line_and_exit_2(capsys, args, said):
    refused(in_process(capsys, *args), said)


def test_a_profile_delay_beyond_an_hour_is_refused_at_validate(tmp_path, capsys):
    profile = tmp_path / "p.yaml"
    profile.write_text("name: big\nocs:\n  switch: {dist: fixed, ms: 1.0e+30}\n"
                       "topology: {hosts: 2, nics_per_host: 1, ocs_size: [4, 4]}\n")
    refused(in_process(capsys, "validate", str(profile)), "ms must be a finite number of at most")


def _requests(path):
    write_requests(pd.DataFrame({"arrival_s": np.arange(10) * 0.5, "prompt_tokens": np.arange(10) + 1,
                                 "output_tokens": np.arange(10) + 1}), path)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "string column", "kind tag", "moe header"])
def test_a_damaged_parquet_trace_is_a_clear_error(tmp_path, capsys, damage):
    path = tmp_path / "t.parquet"
    _requests(path)
    raw = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(raw[:len(raw) // 2])
    elif damage == "flipped":
        path.write_bytes(raw[:4] + bytes(b ^ 0x5A for b in raw[4:-8]) + raw[-8:])
    else:
        table = pq.read_table(path)
        meta = dict(table.schema.metadata or {})
        if damage == "string column":
            table = table.set_column(0, "arrival_s", pa.array(["soon"] * table.num_rows))
        elif damage == "kind tag":
            meta[b"ocs_hil.kind"] = b"\xff\xfe"
        else:
            meta[b"ocs_hil.kind"], meta[b"ocs_hil.moe_header"] = b"moe", b"{not json"
        pq.write_table(table.replace_schema_metadata(meta), path)
    result = in_process(capsys, "traces", "inspect", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-1500:]
    assert result.stderr.strip().count("\n") == 0 and str(path) in result.stderr


def test_a_parquet_reason_over_several_lines_is_still_one_line(tmp_path, capsys):
    """benchmarks/trace_fuzz.py --seed 2: one flipped byte in a page header made pyarrow's reason two lines
    ("Couldn't deserialize thrift ...\\nDeserializing page header failed."), printed as they came."""
    from traces.generate import generate_moe
    from traces.schema import write_moe

    path = tmp_path / "m.parquet"
    write_moe(generate_moe(seed=1, iterations=8, layers=2, micro_batches=1, num_experts=8, top_k=2, ep=4,
                           regime_changes=1), path)
    raw = bytearray(path.read_bytes())
    raw[377] = 187
    path.write_bytes(raw)
    result = in_process(capsys, "traces", "inspect", str(path))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"harness: {path}: damaged or unreadable Parquet file")


@pytest.mark.parametrize("message", ["a\nb", "a \r\n  b\n", "a\u2028b", "a\x0bb"])
def test_an_input_error_is_one_line_whatever_its_message_holds(message):
    from harness.errors import InputError

    assert InputError(message, "f.yaml", 3).format() == "f.yaml:3: a b"
