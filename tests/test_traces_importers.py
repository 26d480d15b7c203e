"""Importers on small synthetic files written here: formats, validation with file:line, MoE traffic."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

import traces
from harness.cli import main
from traces.errors import TraceFormatError
from traces.moe import detect_moe_format
from traces.requests import detect_format
from traces.schema import MoeHeader, MoeTrace, write_moe


def write(path, text):
    path.write_text(text)
    return path


def test_azure_csv(tmp_path):
    p = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.0319600,3180,8\n"
              "2023-11-16 18:17:05,10,1\n")
    frame = traces.load_requests(p)
    assert detect_format(p) == "azure-csv"
    np.testing.assert_allclose(frame["arrival_s"], [0.0, 0.052, 1.02004])
    assert frame["prompt_tokens"].tolist() == [4808, 3180, 10]


@pytest.mark.parametrize("row,line,needle", [
    ("2023-11-16 18:17:04.1,-5,8", 3, "ContextTokens"),
    ("2023-11-16 18:17:04.1,5,x", 3, "GeneratedTokens"),
    ("yesterday,5,8", 3, "TIMESTAMP"),
    ("2023-11-16 18:17:02.0,5,8", 3, "decreases"),
    ("2023-11-16 18:17:04.1,5,8,9", 3, "malformed"),
    ("2023-11-16 18:17:04.1,1e30,8", 3, "ContextTokens must be an integer in 0..2147483647"),  # was -9.2e18
    ("2023-11-16 18:17:04.1,5,99999999999999999999", 3, "GeneratedTokens must be an integer in 0.."),
])
def test_azure_bad_row_names_file_and_line(tmp_path, row, line, needle):
    p = write(tmp_path / "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
              f"2023-11-16 18:17:03.9799600,4808,10\n{row}\n2023-11-16 18:17:09.0,1,1\n")
    with pytest.raises(TraceFormatError) as info:
        traces.load_requests(p)
    assert info.value.file == str(p) and info.value.line == line
    assert needle in info.value.message


def test_mooncake_jsonl_and_bad_line(tmp_path):
    good = ['{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}',
            '{"timestamp": 1500, "input_length": 10, "output_length": 2, "hash_ids": [0]}']
    p = write(tmp_path / "m.jsonl", "\n".join(good) + "\n")
    frame = traces.load_requests(p)
    assert frame["arrival_s"].tolist() == [0.0, 1.5]
    assert frame["prefix_block_ids"].tolist() == [[0, 1], [0]]
    bad = write(tmp_path / "bad.jsonl", good[0] + "\n" + '{"timestamp": 5, "input_length": "x", '
                '"output_length": 1}' + "\n")
    with pytest.raises(TraceFormatError) as info:
        traces.load_requests(bad)
    assert info.value.line == 2
    broken = write(tmp_path / "broken.jsonl", good[0] + "\n" + good[1] + "\n{oops\n")
    with pytest.raises(TraceFormatError) as info:
        traces.load_requests(broken)
    assert info.value.line == 3


def test_burstgpt_csv(tmp_path):
    p = write(tmp_path / "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Session ID\n"
              "5.0,ChatGPT,100,20,120,Conversation log,s1\n7.5,GPT-4,50,0,50,Conversation log,s2\n")
    frame = traces.load_requests(p)
    assert detect_format(p) == "burstgpt-csv"
    assert frame["arrival_s"].tolist() == [5.0, 7.5]
    assert frame["output_tokens"].tolist() == [20, 0]
    assert frame["session_id"].tolist() == ["s1", "s2"]
    bad = write(tmp_path / "bad.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                "5.0,ChatGPT,100,20,120,x\n6.0,ChatGPT,1.5,20,120,x\n")
    with pytest.raises(TraceFormatError) as info:
        traces.load_requests(bad)
    assert info.value.line == 3


def test_canonical_roundtrip_and_unknown_format(tmp_path):
    frame = pd.DataFrame({"arrival_s": [0.0, 0.5], "prompt_tokens": [3, 4], "output_tokens": [1, 2],
                          "prefix_block_ids": [[1], [1, 2]]})
    traces.write_requests(frame, tmp_path / "r.parquet")
    back = traces.load_requests(tmp_path / "r.parquet")
    pd.testing.assert_frame_equal(back[["arrival_s", "prompt_tokens", "output_tokens"]],
                                  frame[["arrival_s", "prompt_tokens", "output_tokens"]])
    assert back["prefix_block_ids"].map(list).tolist() == [[1], [1, 2]]
    with pytest.raises(TraceFormatError, match="unknown trace format"):
        traces.load_requests(write(tmp_path / "x.csv", "a,b\n1,2\n"))


def test_cli_reports_file_and_line_exit_2(tmp_path, capsys):
    p = write(tmp_path / "bad.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,-1,1\n")
    assert main(["traces", "inspect", str(p)]) == 2
    assert f"{p}:3:" in capsys.readouterr().err


def test_sync_windows(tmp_path):
    p = write(tmp_path / "w.csv", "start_s,duration_s,bytes\n0,8,100\n30,8,100\n")
    assert traces.load_sync_windows(p)["start_s"].tolist() == [0.0, 30.0]
    bad = write(tmp_path / "bad.csv", "start_s,duration_s,bytes\n0,8,100\n5,8,100\n")
    with pytest.raises(TraceFormatError) as info:
        traces.load_sync_windows(bad)
    assert info.value.line == 3 and "overlap" in info.value.message


# ---- MoE ---------------------------------------------------------------------------------------------

def brute_force_matrix(counts_by_src: dict[int, list[int]], placement: list[int], ep: int, bpt: int, n: int):
    """Oracle: loop over every (src, expert) and add tokens·bytes to src → owner rank."""
    matrix = np.zeros((n, n), dtype=np.int64)
    for src, counts in counts_by_src.items():
        for expert, tokens in enumerate(counts):
            matrix[src, (src // ep) * ep + placement[expert]] += tokens * bpt
    return matrix


def phases_of(trace):
    return {(p.iteration, p.layer, p.micro_batch, p.phase): p.matrix for p in traces.moe_phases(trace)}


def test_harmoeny_directory(tmp_path):
    rng = np.random.default_rng(0)
    counts = {(rank, layer, it): rng.integers(0, 50, size=6).tolist()
              for rank in range(3) for layer in (1, 3) for it in range(2)}
    for rank in range(3):
        (tmp_path / str(rank)).mkdir()
        for layer in (1, 3):
            lines = ["iteration,latency (ms),expert distribution,total number of tokens sent"]
            lines += [f'{it},1.5,"{counts[(rank, layer, it)]}",7' for it in range(2)]
            write(tmp_path / str(rank) / f"moe_layer-{layer}.csv", "\n".join(lines) + "\n")
    assert detect_moe_format(tmp_path) == "harmoeny"
    placement = [2, 2, 1, 0, 0, 1]
    trace = traces.load_moe(tmp_path, hidden_size=8, dtype_bytes=2, expert_placement=placement)
    assert trace.header.ep == 3 and trace.header.num_experts == 6
    got = phases_of(trace)
    for layer in (1, 3):
        for it in range(2):
            oracle = brute_force_matrix({r: counts[(r, layer, it)] for r in range(3)}, placement, 3, 16, 3)
            np.testing.assert_array_equal(got[(it, layer, 0, "dispatch_fwd")], oracle)
            np.testing.assert_array_equal(got[(it, layer, 0, "combine_fwd")], oracle.T)
            np.testing.assert_array_equal(got[(it, layer, 0, "combine_bwd")], oracle)
            np.testing.assert_array_equal(got[(it, layer, 0, "dispatch_bwd")], oracle.T)


def test_harmoeny_bad_row(tmp_path):
    (tmp_path / "0").mkdir()
    write(tmp_path / "0" / "moe_layer-0.csv", 'iteration,expert distribution\n0,"[1, 2]"\n1,"[1, 2, 3]"\n')
    with pytest.raises(TraceFormatError) as info:
        traces.load_moe(tmp_path, hidden_size=4)
    assert info.value.line == 3 and info.value.file.endswith("moe_layer-0.csv")


def test_flame_parquet(tmp_path):
    rng = np.random.default_rng(1)
    ep, tpmb, mbs, k, experts = 2, 5, 2, 2, 8
    n_tokens = 2 * ep * mbs * tpmb  # two iterations
    idx = np.stack([rng.choice(experts, size=k, replace=False) for _ in range(n_tokens)])
    pq.write_table(pa.table({"indices": idx.tolist(), "scores": np.full((n_tokens, k), 0.5).tolist()}),
                   tmp_path / "layer_07.parquet")
    trace = traces.load_moe(tmp_path, hidden_size=4, dtype_bytes=1, ep=ep, tokens_per_micro_batch=tpmb,
                            micro_batches=mbs, num_experts=experts, backward=False)
    assert trace.header.top_k == k
    got = phases_of(trace)
    placement = trace.header.expert_placement
    oracle = {}  # walk tokens one by one
    for token in range(n_tokens):
        it, within = divmod(token, ep * mbs * tpmb)
        src, mb = within // (mbs * tpmb), (within // tpmb) % mbs
        m = oracle.setdefault((it, 7, mb, "dispatch_fwd"), np.zeros((ep, ep), dtype=np.int64))
        for e in idx[token]:
            m[src, placement[e]] += 4
    assert set(got) == set(oracle) | {(a, b, c, "combine_fwd") for a, b, c, _ in oracle}
    for key, matrix in oracle.items():
        np.testing.assert_array_equal(got[key], matrix)


def test_megatron_log_text_and_json(tmp_path):
    two_d = [[3, 0, 1, 2], [0, 5, 5, 0]]
    p = write(tmp_path / "train.log",
              "INFO starting\n"
              f"[rank0] iteration 4 layer 2 num_global_tokens_per_expert: {json.dumps(two_d)}\n"
              + json.dumps({"iteration": 5, "layer": 2, "num_global_tokens_per_expert": two_d}) + "\n")
    assert detect_moe_format(p) == "megatron"
    trace = traces.load_moe(p, hidden_size=2, dtype_bytes=1, backward=False)
    oracle = brute_force_matrix({0: two_d[0], 1: two_d[1]}, list(trace.header.expert_placement), 2, 2, 2)
    got = phases_of(trace)
    np.testing.assert_array_equal(got[(4, 2, 0, "dispatch_fwd")], oracle)
    np.testing.assert_array_equal(got[(5, 2, 0, "dispatch_fwd")], oracle)
    bad = write(tmp_path / "bad.log", "x\nlayer 1 num_global_tokens_per_expert: [1, 2]\n")
    with pytest.raises(TraceFormatError) as info:
        traces.load_moe(bad, hidden_size=2, ep=2)
    assert info.value.line == 2


def test_megatron_one_d_spreads_evenly(tmp_path):
    p = write(tmp_path / "t.log", "iteration 0 layer 0 num_global_tokens_per_expert: [7, 4]\n")
    trace = traces.load_moe(p, hidden_size=1, dtype_bytes=1, ep=2, backward=False)
    matrix = next(iter(traces.moe_phases(trace))).matrix
    # Expert 0 (rank 0): 7 tokens → 4 from rank 0, 3 from rank 1; expert 1 (rank 1): 2 + 2.
    np.testing.assert_array_equal(matrix, [[4, 2], [3, 2]])


def test_moe_parquet_roundtrip_keeps_header(tmp_path):
    trace = traces.generate_moe(seed=5, iterations=6, layers=2, num_experts=4, ep=2, regions=2,
                                tokens_per_micro_batch=64, regime_changes=[3])
    write_moe(trace, tmp_path / "t.parquet")
    back = traces.load_moe(tmp_path / "t.parquet")
    assert back.header == trace.header and back.regime_changes == (3,)
    pd.testing.assert_frame_equal(back.traffic, trace.traffic)


def test_header_validation():
    with pytest.raises(ValueError):
        MoeHeader(num_experts=4, top_k=2, hidden_size=8, dtype_bytes=2, ep=2, expert_placement=(0, 1, 2, 0))
    with pytest.raises(ValueError):
        MoeHeader(num_experts=4, top_k=5, hidden_size=8, dtype_bytes=2, ep=2)
    with pytest.raises(ValueError):
        MoeTrace(MoeHeader(4, 2, 8, 2, 2), pd.DataFrame({"iteration": [0], "layer": [0], "micro_batch": [0],
                 "phase": ["sideways"], "src_rank": [0], "dst_rank": [1], "bytes": [1]}))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**11), st.integers(0, 20000), st.integers(0, 4000)), min_size=1,
                max_size=40))
def test_azure_roundtrip_property(tmp_path_factory, rows):
    # Offsets in units of 100 ns (the format's 7 fractional digits) from an arbitrary origin.
    rows = sorted(rows)
    origin = pd.Timestamp("2023-11-16 18:00:00")
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for ticks, prompt, output in rows:
        stamp = origin + pd.Timedelta(ticks * 100, "ns")
        lines.append(f"{stamp.strftime('%Y-%m-%d %H:%M:%S')}.{(ticks % 10**7):07d},{prompt},{output}")
    path = tmp_path_factory.mktemp("azure") / "a.csv"
    path.write_text("\n".join(lines) + "\n")
    frame = traces.load_requests(path)
    expected = np.asarray([t for t, _, _ in rows], dtype=np.int64) - rows[0][0]
    np.testing.assert_array_equal(np.round(frame["arrival_s"].to_numpy() * 1e7).astype(np.int64), expected)
    assert frame["prompt_tokens"].tolist() == [p for _, p, _ in rows]
    assert frame["output_tokens"].tolist() == [o for _, _, o in rows]


def test_overflowing_and_undecodable_request_traces_name_their_line(tmp_path):
    rows = ['{"timestamp": 0, "input_length": 6, "output_length": 5}',
            '{"timestamp": 1, "input_length": 100000000000000000000000000000, "output_length": 5}']
    with pytest.raises(TraceFormatError, match="prompt_tokens must be an integer in 0..") as info:
        traces.load_requests(write(tmp_path / "big.jsonl", "\n".join(rows) + "\n"))
    assert info.value.line == 2
    p = tmp_path / "bytes.jsonl"
    p.write_bytes(rows[0].encode() + b"\n" + b'{"timestamp": 1, "input_length": 6, "output_length": 5, "x": "\xff"}\n')
    with pytest.raises(TraceFormatError, match="not UTF-8") as info:
        traces.load_requests(p)
    assert info.value.line == 2
    rows[1] = '{"timestamp": 1, "input_length": 6, "output_length": 5, "hash_ids": [%d]}' % 2**64
    with pytest.raises(TraceFormatError, match="64-bit"):
        traces.load_requests(write(tmp_path / "ids.jsonl", "\n".join(rows) + "\n"))
    rows[1] = '{"timestamp": 1e15, "input_length": 6, "output_length": 5}'  # ms: 3e4 years
    with pytest.raises(TraceFormatError, match="arrival_s must be <="):
        traces.load_requests(write(tmp_path / "late.jsonl", "\n".join(rows) + "\n"))


@pytest.mark.parametrize("column,value,needle", [("bytes", -5, "bytes must be an integer >= 0"),
                                                 ("src_rank", -1, "src_rank must be an integer >= 0"),
                                                 ("dst_rank", 9, "dst_rank 9 outside the trace's ranks 0..3")])
def test_moe_traffic_rejects_negative_bytes_and_ranks_outside_the_trace(column, value, needle):
    header = MoeHeader(num_experts=4, top_k=1, hidden_size=8, dtype_bytes=2, ep=4, n_ranks=4)
    row = {"iteration": 0, "layer": 0, "micro_batch": 0, "phase": "dispatch_fwd", "src_rank": 0, "dst_rank": 1,
           "bytes": 16, column: value}
    with pytest.raises(ValueError, match=needle):
        MoeTrace(header, pd.DataFrame([row]))
