"""The `replay` playbook step end to end (harness run → emulated vLLM endpoint → durable log + summary), and
its summary arithmetic against brute-force counts."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cli import main
from analysis.serving import in_windows
from harness.steps.replay import summarise
from traces.replay import read_replay_log

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
AZURE_CONV = SHARED / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"

# Small, short requests so a run takes a few seconds; the service model is fast relative to the SLOs.
TINY = {"requests": "generate:poisson", "rate": 12.0, "duration_s": 3.0, "prompt_median": 40,
        "output_median": 8, "time_scale": 2.0, "prefill_tokens_per_s": 1e5, "decode_tokens_per_s": 200,
        "batch_slots": 64, "lead_s": 0.3, "timeout_s": 20}


def run_playbook(tmp_path: Path, step: dict, name: str = "rp") -> tuple[int, Path | None]:
    playbook = tmp_path / f"{name}.yaml"
    playbook.write_text(yaml.safe_dump({"name": name, "bench": "emulated:instant", "seed": 3,
                                        "steps": [{"type": "replay", "name": "serve", **step}]}))
    out = tmp_path / "runs"
    code = main(["run", str(playbook), "--out", str(out / name), "-q"])
    runs = sorted(out.iterdir()) if out.exists() else []
    return code, (runs[-1] if runs else None)


def test_every_request_recorded_and_summary_matches_the_log(tmp_path):
    code, run = run_playbook(tmp_path, {**TINY, "slo_e2e_ms": 5000})
    assert code == 0
    requests = pd.read_parquet(run / "replay_serve_requests.parquet")
    log = read_replay_log(run / "replay_serve.jsonl")
    parquet = pd.read_parquet(run / "replay_serve.parquet")
    n = len(requests)
    assert n > 15  # Poisson(36): far above 15 for this seed and any reasonable one
    assert sorted(log["index"]) == list(range(n)) and len(parquet) == n
    log = log.sort_values("index").reset_index(drop=True)
    # Deadlines follow the generated arrivals (absolute schedule, time-scaled ×2).
    expected = np.round(requests["arrival_s"].to_numpy() * 1e9 / 2).astype(np.int64)
    np.testing.assert_array_equal(log["scheduled_ns"] - log["scheduled_ns"][0], expected - expected[0])
    assert (log["prompt_tokens"] == requests["prompt_tokens"]).all()
    out = json.loads((run / "replay_serve.json").read_text())["summary"]
    assert (out["n"], out["recorded"], out["connection_limit_reached"]) == (n, n, 0)
    assert out["ok"] + out["failed"] + out["timeout"] == n
    # Independent recomputation of the reported percentiles from the log (trace time = wall × 2).
    ok = log[log["status"] == "ok"]
    ttft = (ok["first_token_ns"].astype(float) - ok["sent_ns"]) / 1e6 * 2
    e2e = (ok["completed_ns"].astype(float) - ok["sent_ns"]) / 1e6 * 2
    assert out["ttft_ms"]["p50"] == pytest.approx(np.percentile(ttft, 50))
    assert out["e2e_ms"]["p99"] == pytest.approx(np.percentile(e2e, 99))
    expected_bad = (log["status"] != "ok").sum() + (e2e > 5000).sum()
    assert out["violations"] == expected_bad
    run_summary = json.loads((run / "summary.json").read_text())
    assert run_summary["summary"]["results"]["serve"]["n"] == n
    assert "Serving replay" in (run / "summary.md").read_text()


def test_capacity_cut_raises_violations_inside_sync_windows(tmp_path):
    # Capacity 0.05 inside 2-s windows: 3 of 64 slots and decode 20× slower (TPOT 5 ms → 100 ms), so arrivals
    # in a window queue until it ends (TTFT ~0.3-1.7 s) or decode slowly. Outside, TTFT is a few ms (trace
    # time) and TPOT 5 ms: the SLO (TTFT 1 s, TPOT 50 ms) leaves ×200 and ×10 of headroom there, so a machine
    # busy with other work does not make requests outside the windows miss it; inside, TPOT alone misses it.
    step = {**TINY, "rate": 10.0, "duration_s": 8.0, "output_median": 20, "time_scale": 2.0,
            "interference": "generate:diloco", "sync_count": 2, "sync_window_s": 2.0, "sync_min_gap_s": 3.0,
            "interference_capacity": 0.05, "slo_ttft_ms": 1000, "slo_tpot_ms": 50}
    code, run = run_playbook(tmp_path, step)
    assert code == 0
    out = json.loads((run / "replay_serve.json").read_text())["summary"]
    windows = pd.read_parquet(run / "replay_serve_windows.parquet")
    assert len(windows) == 2 and (windows["duration_s"] == 2.0).all() and out["interference_applied"]
    assert out["windows"]["requests_inside"] > 5 and out["windows"]["requests_outside"] > 10
    assert out["violation_rate_inside"] >= out["violation_rate_outside"]
    assert out["violation_rate_inside"] - out["violation_rate_outside"] > 0.3  # a large effect, not a tilt
    assert out["inside_greater_p"] < 0.01


def test_sigterm_mid_replay_aborts_then_resume_replays_everything(tmp_path):
    import os
    import signal
    import threading

    step = {**TINY, "duration_s": 8.0, "time_scale": 2.0}  # ~4 s of wall time
    stop = threading.Event()

    def terminate_once_records_are_on_disk():  # the log is fsynced every 0.5 s while the replay runs
        while not stop.wait(0.05):
            if any(f.stat().st_size for f in (tmp_path / "runs").glob("*/replay_serve.jsonl")):
                os.kill(os.getpid(), signal.SIGTERM)
                return

    # Outside the run a late SIGTERM is ignored instead of killing the test process.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    watcher = threading.Thread(target=terminate_once_records_are_on_disk, daemon=True)
    watcher.start()
    try:
        code, run = run_playbook(tmp_path, step)
    finally:
        stop.set()
        watcher.join()
        signal.signal(signal.SIGTERM, previous)
    assert code == 128 + signal.SIGTERM
    partial = read_replay_log(run / "replay_serve.jsonl")
    n = len(pd.read_parquet(run / "replay_serve_requests.parquet"))
    assert 0 < len(partial) < n  # some requests went out, the rest were never sent
    assert not (run / "replay_serve.json").exists()
    assert main(["run", str(tmp_path / "rp.yaml"), "--resume", str(run), "-q"]) == 0
    aside = read_replay_log(run / "replay_serve.incomplete.jsonl")
    assert aside["index"].tolist() == partial["index"].tolist()
    full = read_replay_log(run / "replay_serve.jsonl")
    assert sorted(full["index"]) == list(range(n))
    assert json.loads((run / "replay_serve.json").read_text())["summary"]["recorded"] == n


@pytest.mark.skipif(not AZURE_CONV.exists(), reason=f"shared Azure trace absent ({AZURE_CONV})")
def test_real_azure_trace_with_limit(tmp_path):
    import traces

    step = {"requests": str(AZURE_CONV), "limit": 25, "time_scale": 20.0, "prefill_tokens_per_s": 2e5,
            "decode_tokens_per_s": 2000, "lead_s": 0.3, "slo_ttft_ms": 2000}
    code, run = run_playbook(tmp_path, step)
    assert code == 0
    log = read_replay_log(run / "replay_serve.jsonl").sort_values("index")
    first = traces.load_requests(AZURE_CONV).iloc[:25]
    assert len(log) == 25
    assert log["prompt_tokens"].tolist() == first["prompt_tokens"].tolist()
    assert log["output_tokens_requested"].tolist() == np.maximum(first["output_tokens"], 1).tolist()
    out = json.loads((run / "replay_serve.json").read_text())["summary"]
    assert out["source"] == AZURE_CONV.name and out["n"] == 25


@pytest.mark.parametrize("params, message", [
    ({"endpoint": "http://192.0.2.7:8000"}, "not a loopback address"),
    ({"endpoint": "ftp://127.0.0.1:21"}, "endpoint must be"),
    ({"requests": "missing.csv"}, "no such trace file"),
    ({"requests": "generate:zipf"}, "unknown generator"),
    ({"interference": "generate:diloco", "sync_count": 9, "sync_window_s": 8.0}, "do not fit"),
    ({"interference_capacity": 0.0}, "interference_capacity"),
    ({"endpoint": "http://127.0.0.1:9", "interference": "generate:diloco"}, "only be applied to the emulated"),
])
def test_bad_params_exit_2_naming_the_playbook_line(tmp_path, capsys, params, message):
    code, _ = run_playbook(tmp_path, {**TINY, **params})
    err = capsys.readouterr().err
    assert code == 2
    assert f"{tmp_path / 'rp.yaml'}:" in err and message in err
    assert "Traceback" not in err


def test_relative_trace_path_resolves_against_the_playbook(tmp_path):
    import traces

    traces.write_requests(pd.DataFrame({"arrival_s": [0.0, 0.05, 0.1], "prompt_tokens": [5, 6, 7],
                                        "output_tokens": [2, 3, 0]}), tmp_path / "tiny.parquet")
    code, run = run_playbook(tmp_path, {"requests": "tiny.parquet", "lead_s": 0.2, "slo_ttft_ms": 1000})
    assert code == 0
    log = read_replay_log(run / "replay_serve.jsonl").sort_values("index")
    assert log["prompt_tokens"].tolist() == [5, 6, 7] and (log["status"] == "ok").all()
    assert log["output_tokens"].tolist() == [2, 3, 1]  # 0 is sent as 1 (vLLM needs at least one)


def test_loopback_url_endpoint_with_a_sync_window_file(tmp_path):
    """An endpoint the step does not own (here an emulator on its own thread): windows from a file only split
    the metrics, latencies are wall time (no service scaling), and the endpoint saw every request."""
    import asyncio
    import threading

    import traces
    from devices.emulated.vllm_server import ServiceModel, VllmEmulator

    emulator = VllmEmulator(ServiceModel(prefill_tokens_per_s=1e6, decode_tokens_per_s=2000))
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def serve():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(emulator.start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(emulator.stop())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    traces.write_sync_windows(pd.DataFrame({"start_s": [0.5], "duration_s": [0.5], "bytes": [1]}),
                              tmp_path / "sync.parquet")
    try:
        code, run = run_playbook(tmp_path, {**TINY, "duration_s": 1.5, "time_scale": 1.0, "endpoint": emulator.url,
                                            "interference": "sync.parquet", "slo_ttft_ms": 500})
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert code == 0
    out = json.loads((run / "replay_serve.json").read_text())["summary"]
    requests = pd.read_parquet(run / "replay_serve_requests.parquet")
    arrivals = requests["arrival_s"].to_numpy()
    assert (out["latency_scale"], out["endpoint"], out["interference_applied"]) == (1.0, emulator.url, False)
    assert out["windows"]["requests_inside"] == int(((arrivals >= 0.5) & (arrivals < 1.0)).sum())
    assert emulator.stats.completed == out["n"] == len(requests)


# ---- summary arithmetic ----------------------------------------------------------------------------------
times = st.lists(st.floats(0, 100, allow_nan=False), max_size=40)


@settings(max_examples=200, deadline=None)
@given(times, st.lists(st.tuples(st.floats(0, 9, allow_nan=False), st.floats(0.01, 9, allow_nan=False)),
                       max_size=8))
def test_in_windows_matches_brute_force(ts, spans):
    # Non-overlapping windows: lay the (gap, length) pairs end to end.
    starts, t = [], 0.0
    for gap, length in spans:
        starts.append((t + gap, length))
        t += gap + length
    windows = pd.DataFrame(starts, columns=["start_s", "duration_s"])
    got = in_windows(np.asarray(ts), windows)
    expected = [any(s <= x < s + d for s, d in starts) for x in ts]
    assert got.tolist() == expected


def test_summary_counts_by_hand():
    # Five requests; trace-time latencies (×2 of the wall values below). Windows cover arrivals 1 and 2.
    ms = 1_000_000
    rows = [  # index, sent, first, done, tokens, status
        (0, 0, 10 * ms, 110 * ms, 11, "ok"),  # ttft 20, tpot 20, e2e 220
        (1, 0, 300 * ms, 500 * ms, 3, "ok"),  # ttft 600 (violates 500), tpot 200, e2e 1000
        (2, 0, None, 900 * ms, None, "timeout"),  # failed: always a violation
        (3, 0, 40 * ms, 40 * ms, 1, "ok"),  # one token: TPOT undefined, ttft 80
        (4, 0, 100 * ms, 2100 * ms, 5, "ok"),  # tpot 1000 (violates 100)
    ]
    records = pd.DataFrame([{"index": i, "scheduled_ns": 0, "sent_ns": s, "send_error_ns": 1000 * (i + 1),
                             "first_token_ns": f, "completed_ns": d, "output_tokens": k, "status": st_}
                            for i, s, f, d, k, st_ in rows]).sample(frac=1, random_state=1)  # log order ≠ index
    for col in ("first_token_ns", "output_tokens"):
        records[col] = records[col].astype("Int64")
    windows = pd.DataFrame({"start_s": [1.0], "duration_s": [2.0]})
    s = summarise(records, np.array([0.0, 1.0, 2.5, 3.0, 4.0]), windows, slo_ttft_ms=500, slo_tpot_ms=100,
                  latency_scale=2.0)
    assert (s["n"], s["ok"], s["failed"], s["timeout"]) == (5, 4, 0, 1)
    assert s["windows"] == {"count": 1, "requests_inside": 2, "requests_outside": 3}
    assert s["violations"] == 3  # 1 (ttft and tpot), 2 (timeout), 4 (tpot)
    assert s["violation_rate"] == pytest.approx(3 / 5)
    assert s["violation_rate_inside"] == 1.0 and s["violation_rate_outside"] == pytest.approx(1 / 3)
    assert s["sync_excess"] == pytest.approx(2 / 3)
    assert s["ttft_ms"]["p50"] == pytest.approx(np.percentile([20, 600, 80, 200], 50))
    assert s["tpot_ms"]["p50"] == pytest.approx(np.percentile([20, 200, 1000], 50))
    assert s["send_error_us"]["p50"] == pytest.approx(3.0)
    # Fisher's exact one-sided p for [[2, 0], [1, 2]]: P(X >= 2) = C(3,2)·C(2,0)/C(5,2) = 3/10.
    assert s["inside_greater_p"] == pytest.approx(0.3)
    # aiperf's terms: ITL is TPOT's quantity; duration = first send (0) to last ok answer (2.1 s wall, ×2);
    # 4 ok requests and their 11 + 3 + 1 + 5 output tokens over it.
    a = s["aiperf"]
    assert a["inter_token_latency_ms"] == s["tpot_ms"] and a["time_to_first_token_ms"] == s["ttft_ms"]
    assert a["benchmark_duration_s"] == pytest.approx(4.2)
    assert a["request_throughput_per_s"] == pytest.approx(4 / 4.2)
    assert a["output_token_throughput_per_s"] == pytest.approx(20 / 4.2)
