"""Trace importer fuzz: mutated real and generated traces through `harness traces inspect`; every outcome
must be exit 0 or a one-line `file:line` error with exit 2 — never a traceback.

Seeds: the Azure LLM 2023 and Mooncake traces from ../shared/traces (a slice; `OCS_HIL_SHARED_TRACES` names
another folder), a BurstGPT-style CSV, generated MoE traces (Megatron JSON lines), and Parquet: canonical
request, sync-window and MoE traces and a FLAME-style routing file. Mutations: byte flips and cuts,
duplicated and dropped lines, numbers replaced by negative, huge, fractional or non-finite values, headers
renamed, empty and binary files; for Parquet also byte flips and cuts of the binary, columns of the wrong
type, odd kind tags and MoE headers.

    nice -n 10 .venv/bin/python benchmarks/trace_fuzz.py [--count 520] [--seed 1]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import random
import re
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = Path(os.environ.get("OCS_HIL_SHARED_TRACES") or ROOT.parent / "shared" / "traces")

from harness.cli import main  # noqa: E402

NUMBERS = ["-1", "-0.5", "1e30", "-1e30", "9223372036854775808", "1.5", "nan", "inf", "-inf", "0x10", "",
           "1e308", "99999999999999999999999999", "NaN", "null", "[]", "{}", "\"7\"", "true"]


def seeds(work: Path) -> list[tuple[str, str]]:
    """(name, text) of well-formed traces."""
    out = []
    for path, lines in ((SHARED / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv", 60),
                        (SHARED / "mooncake-fast25" / "synthetic_trace.jsonl", 40)):
        if path.exists():
            with open(path) as f:
                out.append((path.suffix, "".join(f.readline() for _ in range(lines))))
    out.append((".csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "".join(
        f"{i * 0.7:.1f},ChatGPT,{100 + i},{20 + i},{120 + 2 * i},Conversation log\n" for i in range(30))))
    out.append((".jsonl", "".join(
        '{"tokens_per_expert": [[%d, %d, %d, %d], [%d, %d, %d, %d]], "iteration": %d, "layer": %d}\n'
        % (*(random.Random(i).randrange(0, 50) for _ in range(8)), i // 2, i % 2) for i in range(12))))
    return out


def parquet_seeds() -> list[tuple[str, bytes]]:
    """(".parquet", bytes) of well-formed Parquet traces, written through the project's own writers."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from traces.generate import generate_moe
    from traces.schema import write_moe, write_requests, write_sync_windows

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        write_requests(pd.DataFrame({"arrival_s": np.arange(20) * 0.5, "prompt_tokens": np.arange(20) + 10,
                                     "output_tokens": np.arange(20) + 3}), base / "r.parquet")
        write_sync_windows(pd.DataFrame({"start_s": [0.0, 30.0, 60.0], "duration_s": [8.0, 8.0, 8.0],
                                         "bytes": [10**9] * 3}), base / "s.parquet")
        write_moe(generate_moe(seed=1, iterations=8, layers=2, micro_batches=1, num_experts=8, top_k=2,
                                            ep=4, regime_changes=1),
                  base / "m.parquet")
        pq.write_table(pa.table({"indices": [[0, 1], [2, 3], [1, 2]], "layer": [0, 0, 1]}), base / "f.parquet")
        for name in ("r", "s", "m", "f"):
            out.append((".parquet", (base / f"{name}.parquet").read_bytes()))
    return out


def mutate_parquet(raw: bytes, rng: random.Random) -> bytes:
    """Damage a Parquet file: cut, flipped bytes, or rewritten with a wrong column type or odd tags."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kind = rng.randrange(5)
    if kind == 0:
        return raw[:rng.randrange(len(raw))]
    if kind == 1:
        data = bytearray(raw)
        for _ in range(rng.randint(1, 16)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    table = pq.read_table(pa.BufferReader(raw))
    if kind == 2:  # a column of another type
        i = rng.randrange(table.num_columns)
        column = rng.choice([pa.array(["x"] * table.num_rows), pa.array([None] * table.num_rows, pa.null()),
                             pa.array([[1.5]] * table.num_rows), pa.array([2**63 - 1] * table.num_rows),
                             pa.array([float("nan")] * table.num_rows)])
        table = table.set_column(i, table.schema.field(i).name, column)
    else:  # odd metadata: a kind tag or MoE header that is not what it claims
        meta = dict(table.schema.metadata or {})
        key = rng.choice([b"ocs_hil.kind", b"ocs_hil.moe_header", b"ocs_hil.regime_changes"])
        meta[key] = rng.choice([b"\xff\xfe", b"{}", b"[", b"moe", b"requests", b'{"ranks": -1}', b"null",
                                b'{"ranks": 1e400}'])
        table = table.replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def mutate(text: str, rng: random.Random) -> str | bytes:
    kind = rng.randrange(10)
    lines = text.splitlines(keepends=True)
    if kind == 0 and text:  # cut anywhere
        return text[:rng.randrange(len(text))]
    if kind == 1 and text:  # flip bytes
        raw = bytearray(text.encode())
        for _ in range(rng.randint(1, 8)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if kind == 2 and len(lines) > 2:  # duplicate / drop / shuffle lines
        i = rng.randrange(1, len(lines))
        op = rng.randrange(3)
        if op == 0:
            lines.insert(i, lines[i])
        elif op == 1:
            del lines[i]
        else:
            rng.shuffle(lines)
        return "".join(lines)
    if kind in (3, 4, 5):  # numbers replaced
        numbers = list(re.finditer(r"-?\d+(\.\d+)?", text))
        for m in rng.sample(numbers, min(len(numbers), rng.randint(1, 4))) if numbers else []:
            text = text[:m.start()] + rng.choice(NUMBERS) + text[m.end():]
            numbers = list(re.finditer(r"-?\d+(\.\d+)?", text))
            if not numbers:
                break
        return text
    if kind == 6 and lines:  # header renamed or removed
        lines[0] = rng.choice(["", "a,b,c\n", lines[0].upper(), lines[0].replace(",", ";"), "{}\n"])
        return "".join(lines)
    if kind == 7:
        return rng.choice(["", "\n", "\x00" * 64, "[1, 2, 3]\n", '{"a": 1}\n', "id\n", b"\xff\xfe\x00garbage"])
    if kind == 8 and lines:  # a very long line
        return "".join(lines[:2]) + lines[-1].rstrip("\n") * rng.randint(10, 200) + "\n"
    return text.replace(",", rng.choice([",,", ", ", "\t", ",\"", ""]), rng.randint(1, 3))


def main_fuzz() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=520)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, default=5, help="tracebacks to print")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    outcomes: collections.Counter = collections.Counter()
    by_format: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    crashes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="trace-fuzz-") as tmp:
        base = seeds(Path(tmp)) + parquet_seeds()
        for i in range(args.count):
            suffix, text = base[i % len(base)]
            data = mutate_parquet(text, rng) if isinstance(text, bytes) else mutate(text, rng)
            path = Path(tmp) / f"t{i}{suffix}"
            path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogateescape"))
            err = io.StringIO()
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                    code = main(["traces", "inspect", str(path), "--json"])
                lines = [ln for ln in err.getvalue().splitlines() if ln]
                if code == 2 and (len(lines) != 1 or "Traceback" in err.getvalue()):
                    outcome = "exit 2 but not one line"
                    crashes.append(f"{path.name}: {err.getvalue()[:300]}")
                else:
                    outcome = f"exit {code}"
            except SystemExit as exc:
                outcome = f"exit {exc.code}"
            except MemoryError:
                outcome = "OUT OF MEMORY"
                crashes.append(f"{path.name}: MemoryError")
            except BaseException as exc:  # a traceback
                outcome = f"TRACEBACK {type(exc).__name__}"
                crashes.append(f"{path.name}: {''.join(traceback.format_exception(exc))[-1200:]}")
            outcomes[outcome] += 1
            by_format[suffix][outcome] += 1
    print(f"{args.count} mutated traces (seed {args.seed}):", ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())))
    columns = sorted(outcomes)
    print("\n| format | files | " + " | ".join(columns) + " |\n|---|---:|" + "---:|" * len(columns))
    for suffix, counts in sorted(by_format.items()):
        print(f"| {suffix} | {sum(counts.values())} | " + " | ".join(str(counts[c]) for c in columns) + " |")
    for c in crashes[:args.show]:
        print("----\n" + c)
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main_fuzz())
