"""NVIDIA aiperf, a load generator we did not write, replays a small Mooncake-format trace against the emulated
vLLM endpoint; its per-request TTFT and inter-token latency are held to the endpoint's ground truth (the
service model's first- and last-token instants for each received request). Runs where aiperf and the
`tokenizers` library are installed (`pip install -e '.[aiperf]'`, or aiperf in its own environment named by
OCS_HIL_AIPERF); skips with the reason otherwise."""
from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest

from traces.aiperf import aiperf_command, aiperf_records, aiperf_summary, run_aiperf

COMMAND = aiperf_command()
pytestmark = [
    pytest.mark.skipif(COMMAND is None, reason="aiperf is not installed (pip install -e '.[aiperf]', or name an "
                                               "aiperf executable in OCS_HIL_AIPERF)"),
    pytest.mark.timeout(240),
]

# Tolerance, stated: aiperf's TTFT spans its send to its first chunk, which holds the endpoint's receive to its
# first token, so per request it is never shorter than the truth (less 2 ms of stamping) and, in the median,
# at most a quarter longer; its ITL ((latency − TTFT)/(OSL − 1)) is within a quarter of the truth's.
TTFT_SLACK_MS, RELATIVE = 2.0, 0.25


def mooncake(path, n=16):
    """A synthetic Mooncake-format trace: ms timestamps, lengths, one prefix-block id per 512 tokens."""
    rows = []
    for i in range(n):
        length = 600 + 41 * i
        rows.append({"timestamp": 120 * i, "input_length": length, "output_length": 8 + i,
                     "hash_ids": list(range(3 * i, 3 * i + (length + 511) // 512))})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_aiperf_replays_a_mooncake_trace_and_agrees_with_the_endpoints_truth(tmp_path):
    pytest.importorskip("tokenizers", reason="the tokenizers library builds aiperf's local tokenizer")
    from analysis.serving import ServiceModel
    from devices.emulated.vllm_server import VllmEmulator

    rows = mooncake(tmp_path / "trace.jsonl")
    emulator = VllmEmulator(ServiceModel(prefill_tokens_per_s=10_000, decode_tokens_per_s=50, batch_slots=64))
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def serve():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(emulator.start())
        started.set()
        loop.run_forever()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(30)
    try:
        run_aiperf(COMMAND, emulator.url, emulator.model, tmp_path / "trace.jsonl", tmp_path / "out",
                   tmp_path / "hf")
    except Exception as exc:  # aiperf's own output says why
        pytest.fail(f"aiperf failed: {getattr(exc, 'stdout', '')[-3000:]}{getattr(exc, 'stderr', '')[-3000:]}")
    finally:
        asyncio.run_coroutine_threadsafe(emulator.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)

    got = aiperf_records(tmp_path / "out")
    truth = sorted(emulator.stats.records)  # (received, admitted, first token, done) ns, by receive time
    assert len(got) == len(truth) == len(rows)
    # The local tokenizer: aiperf's own lengths are the trace's and the endpoint's usage, request by request.
    assert got["input_sequence_length"].tolist() == [r["input_length"] for r in rows]
    assert got["usage_prompt_tokens"].tolist() == [r["input_length"] for r in rows]
    assert got["output_sequence_length"].tolist() == [r["output_length"] for r in rows]
    received, _, first, done = (np.asarray(c, dtype=float) for c in zip(*truth))
    true_ttft = (first - received) / 1e6
    true_itl = (done - first) / 1e6 / (np.asarray([r["output_length"] for r in rows]) - 1)
    ttft, itl = got["time_to_first_token"].to_numpy(float), got["inter_token_latency"].to_numpy(float)
    assert np.all(ttft >= true_ttft - TTFT_SLACK_MS), list(zip(ttft, true_ttft))
    assert np.median(ttft - true_ttft) <= RELATIVE * np.median(true_ttft), list(zip(ttft, true_ttft))
    assert abs(np.median(itl) - np.median(true_itl)) <= RELATIVE * np.median(true_itl), (itl, true_itl)
    summary = aiperf_summary(tmp_path / "out")
    assert summary["request_count"]["avg"] == len(rows)
    assert summary["total_osl"]["avg"] == sum(r["output_length"] for r in rows)
