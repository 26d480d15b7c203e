"""A run's summary is made a block of cycles at a time with what it needs of each block on disk (harness.finish):
the numbers are those of the whole run at once, and the memory it holds does not grow with the run's length."""
from __future__ import annotations

import json
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from analysis.accuracy import OCS_TRUTH_STAGES, accuracy_table, assign_cycles, match, ocs_command_check, \
    ocs_command_table
from analysis.stats import UP_STAGES, summarize_events
from harness import finish
from harness.eventlog import EVENT_DTYPES, read_parquet_events
from harness.events import EVENT_COLUMNS, STAGES
from harness.record import to_jsonable


def in_memory(ctx, events_path) -> dict:
    """The summary's numbers from the whole run at once: every event and every truth row in memory."""
    events = read_parquet_events(events_path)
    measured = events[events["cycle"] > 0]
    windows = [tuple(w) for r in ctx.results.values() for w in r.truth_windows]

    def truth(stages):
        rows = assign_cycles(ctx.emulated.ground_truth_frame(stages), windows)
        return rows[rows["cycle"] >= 1]

    return {"delays_ms": summarize_events(measured, ctx.seed),
            "accuracy": accuracy_table(match(measured, truth(set(STAGES)))).to_dict(orient="records"),
            "ocs_command": ocs_command_table(ocs_command_check(measured, truth(set(OCS_TRUTH_STAGES))))}


def same(a, b) -> bool:
    """Equal numbers, NaN included (as the record writes them)."""
    return json.dumps(to_jsonable(a), sort_keys=True) == json.dumps(to_jsonable(b), sort_keys=True)


def test_a_summary_made_in_blocks_on_disk_is_the_whole_runs_bit_for_bit(tmp_path, run_playbook, monkeypatch):
    monkeypatch.setattr(finish, "BLOCK_CYCLES", 2)  # 7 cycles: 4 blocks
    monkeypatch.setattr(finish, "TRUTH_ROWS", 50)   # a cycle's truth spans chunks of the log
    monkeypatch.setattr(finish.Spool, "CHUNK", 5)   # columns spill to their files many times
    seen, real = {}, finish.build_summary

    def build_summary(ctx, events, status, wall_s):
        summary = real(ctx, events, status, wall_s)
        seen.update(summary=summary, expected=in_memory(ctx, ctx.run_dir / "events.parquet"))
        return summary

    monkeypatch.setattr(finish, "build_summary", build_summary)
    playbook = tmp_path / "pb.yaml"
    playbook.write_text(yaml.safe_dump({"name": "t", "bench": "emulated:instant", "seed": 3, "cycles": 7, "steps": [
        {"type": "turnaround", "name": "measure", "cycle_timeout_s": 20, "clock_warmup_s": 0.3}]}))
    result = run_playbook(playbook, bench="emulated:instant")
    assert result.run_dir is not None and seen, result
    summary, expected = seen["summary"], seen["expected"]
    assert summary["delays_ms"]["cycles"] == 7 and len(summary["accuracy"]) > 2 and summary["ocs_command"]["n"] == 7
    for key, value in expected.items():
        assert same(summary[key], value), key
    assert same(result.summary()["summary"]["accuracy"], expected["accuracy"])  # as written


def synthetic_events(path, cycles: int, ports: int = 8, seed: int = 1) -> None:
    """events.parquet of `cycles` turnaround cycles on `ports` ports: each cycle's command, then every up-stage of
    every port (random gaps), in row groups of ~500 cycles as a run writes them."""
    rng = np.random.default_rng(seed)
    cycle = np.arange(1, cycles + 1)
    sent = cycle * 10**9 + rng.integers(0, 10**6, cycles)
    done = sent + rng.integers(30, 60, cycles) * 10**6
    stages = list(UP_STAGES[1:])
    port_t = done[:, None, None] + np.cumsum(rng.integers(10**5, 10**8, (cycles, ports, len(stages))), axis=2)
    parts = [pd.DataFrame({"cycle": cycle, "stage": "ocs_command_sent", "host": "", "port": "", "t_ns": sent}),
             pd.DataFrame({"cycle": cycle, "stage": "ocs_command_completed", "host": "", "port": "", "t_ns": done}),
             pd.DataFrame({"cycle": np.repeat(cycle, ports * len(stages)),
                           "stage": np.tile(stages, cycles * ports),
                           "host": np.tile(np.repeat([f"gpu{p // 2}" for p in range(ports)], len(stages)), cycles),
                           "port": np.tile(np.repeat([f"p{p % 2}" for p in range(ports)], len(stages)), cycles),
                           "t_ns": port_t.ravel()})]
    events = pd.concat(parts, ignore_index=True).sort_values(["cycle", "t_ns"], kind="stable")
    for column in EVENT_COLUMNS:
        if column not in events:
            events[column] = 0 if EVENT_DTYPES[column] == "int64" else "x"
    events = events[list(EVENT_COLUMNS)].astype(EVENT_DTYPES)
    pq.write_table(pa.Table.from_pandas(events, preserve_index=False), path,
                   row_group_size=500 * (2 + ports * len(stages)))


def test_memory_held_between_blocks_does_not_grow_with_the_campaign(tmp_path, monkeypatch):
    """What the summary keeps from block to block stays put however many blocks come: 12 blocks of 250 cycles on 8
    ports, whose stage tables held to the end would grow it by > 2 MB."""
    if hasattr(finish, "Spool"):
        monkeypatch.setattr(finish.Spool, "CHUNK", 256)  # its columns' in-memory tails: 2 KiB each
    monkeypatch.setattr(finish, "BLOCK_CYCLES", 250)
    path = tmp_path / "events.parquet"
    synthetic_events(path, cycles=3000)
    ctx = SimpleNamespace(emulated=None, results={}, inventory=SimpleNamespace(name="synthetic"), seed=1)
    held, real_blocks = [], finish.EventBlocks.blocks

    def blocks(self, first=None, last=None):
        for item in real_blocks(self, first, last):
            held.append(tracemalloc.get_traced_memory()[0])
            yield item

    monkeypatch.setattr(finish.EventBlocks, "blocks", blocks)
    from analysis.stats import cycle_tables

    one_block = read_parquet_events(path).query("cycle >= 1 and cycle < 251")
    table_bytes = int(cycle_tables(one_block)["table"].memory_usage(deep=True).sum())
    tracemalloc.start()
    try:
        summary = finish.build_summary(ctx, finish.EventBlocks(path), "ok", 1.0)
    finally:
        tracemalloc.stop()
    assert summary["delays_ms"]["cycles"] == 3000 and len(held) == 12
    growth = held[-1] - held[1]  # from the first block summarised to the last
    # (a stage table of one block is ~0.2 MB: the eleven more kept to the end would be > 2 MB)
    assert 11 * table_bytes > 2e6 and growth < 5e5, (growth, table_bytes, held)


def test_blocks_read_by_row_group_are_the_events_of_their_cycles(tmp_path, monkeypatch):
    """Oracle: the whole file filtered by each block's cycles. Row groups that end mid-cycle, a late event of an
    earlier cycle in a later row group, and blocks that begin inside a row group kept from the block before."""
    path = tmp_path / "events.parquet"
    synthetic_events(path, cycles=40, ports=2)
    events = read_parquet_events(path)
    late = events[events["cycle"] == 3].head(1).assign(t_ns=10**15)
    events = pd.concat([events, late], ignore_index=True)  # cycle 3's last event written after cycle 40's
    pq.write_table(pa.Table.from_pandas(events, preserve_index=False), path, row_group_size=37)
    monkeypatch.setattr(finish, "BLOCK_CYCLES", 7)
    blocks = finish.EventBlocks(path)
    assert pq.ParquetFile(path).metadata.num_row_groups > 10
    seen = 0
    for block, a, b in blocks.blocks():
        expected = events[(events["cycle"] >= a) & (events["cycle"] < b)].reset_index(drop=True)
        pd.testing.assert_frame_equal(block.reset_index(drop=True), expected)
        seen += len(block)
    assert seen == len(events)
