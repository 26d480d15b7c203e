"""`harness traces ...` end to end through harness.cli.main."""
from __future__ import annotations

import json

import pandas as pd
import pytest

import traces
from harness.cli import main


def test_generate_moe_then_inspect_json_and_heatmap(tmp_path, capsys):
    out, truth = tmp_path / "moe.parquet", tmp_path / "truth.json"
    assert main(["traces", "generate", "moe", "--seed", "9", "--out", str(out), "--truth-out", str(truth),
                 "--iterations", "12", "--regime-changes", "4,8", "--ep", "4", "--experts", "8"]) == 0
    capsys.readouterr()
    assert json.loads(truth.read_text()) == {"regime_changes": [4, 8]}
    png = tmp_path / "heat.png"
    assert main(["traces", "inspect", str(out), "--json", "--plot", str(png)]) == 0
    stats = json.loads(capsys.readouterr().out)
    trace = traces.load_moe(out)
    assert stats["kind"] == "moe" and stats["iterations"] == 12 and stats["regime_changes"] == [4, 8]
    assert stats["bytes_total"] == int(trace.traffic["bytes"].sum())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_generate_mmpp_truth_and_rate_plot(tmp_path, capsys):
    out, truth = tmp_path / "r.parquet", tmp_path / "t.json"
    assert main(["traces", "generate", "mmpp", "--seed", "2", "--out", str(out), "--truth-out", str(truth),
                 "--duration-s", "200"]) == 0
    expected = traces.mmpp_arrivals(seed=2, base_rate=5.0, burst_rate=50.0, duration_s=200.0)
    assert json.loads(truth.read_text())["bursts"] == expected.bursts.to_dict(orient="records")
    pd.testing.assert_frame_equal(traces.load_requests(out), expected.requests)
    png = tmp_path / "rate.png"
    assert main(["traces", "inspect", str(out), "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "mean_rate_per_s" in capsys.readouterr().out


def test_convert_azure_to_parquet_and_csv(tmp_path, capsys):
    src = tmp_path / "a.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.5,10,2\n"
                   "2023-11-16 18:17:04.0,20,3\n")
    assert main(["traces", "convert", str(src), str(tmp_path / "a.parquet")]) == 0
    assert main(["traces", "convert", str(tmp_path / "a.parquet"), str(tmp_path / "b.csv")]) == 0
    back = traces.load_requests(tmp_path / "b.csv")
    assert back["arrival_s"].tolist() == [0.0, 0.5] and back["prompt_tokens"].tolist() == [10, 20]


def test_generate_diloco_and_inspect(tmp_path, capsys):
    out = tmp_path / "w.parquet"
    assert main(["traces", "generate", "diloco", "--seed", "1", "--out", str(out), "--count", "4"]) == 0
    capsys.readouterr()
    assert main(["traces", "inspect", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["kind"] == "sync_windows" and stats["rows"] == 4 and stats["busy_s"] == 32.0


@pytest.mark.parametrize("argv", [
    ["traces", "generate", "diloco", "--seed", "1", "--out", "X", "--count", "99"],
    ["traces", "inspect", "does-not-exist.csv"],
])
def test_bad_input_exits_2(tmp_path, capsys, argv):
    argv = [a.replace("X", str(tmp_path / "x.parquet")) for a in argv]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("harness: ")


def test_routing_import_without_hidden_size_is_input_error(tmp_path, capsys):
    log = tmp_path / "t.log"
    log.write_text("iteration 0 layer 0 num_global_tokens_per_expert: [[1, 2]]\n")
    assert main(["traces", "inspect", str(log)]) == 2
    assert "hidden_size" in capsys.readouterr().err
    assert main(["traces", "inspect", str(log), "--hidden-size", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes_by_phase"]["dispatch_fwd"] == 3 * 8 * 2


def test_replay_command_against_standalone_emulator(tmp_path, capsys):
    import subprocess
    import sys

    import pyarrow.parquet as pq

    proc = subprocess.Popen([sys.executable, "-m", "devices.emulated.vllm_server", "--port", "0", "--time-scale",
                             "20", "--decode-tokens-per-s", "500"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening 127.0.0.1:")
        trace = tmp_path / "t.csv"
        trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,5,3\n0.5,6,4\n1.0,7,2\n1.0,100000,1\n")
        log, table = tmp_path / "r.jsonl", tmp_path / "r.parquet"
        code = main(["traces", "replay", str(trace), "--url", "http://" + line.split()[1], "--log", str(log),
                     "--parquet", str(table), "--time-scale", "20", "--json"])
        out = json.loads(capsys.readouterr().out)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert code == 1  # the last request exceeds the context length: recorded, and the run is flagged
    assert out["by_status"] == {"ok": 3, "http_error": 1, "timeout": 0, "error": 0}
    rows = pq.read_table(table).to_pandas().sort_values("index")
    assert rows["index"].tolist() == [0, 1, 2, 3] and rows["output_tokens"].tolist()[:3] == [3, 4, 2]
