"""Timed replay against the emulated endpoint: every request recorded (failures too), absolute deadlines,
durable log convertible to Parquet."""
from __future__ import annotations

import asyncio
import json
import socket

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from analysis.serving import ServiceModel
from devices.emulated.vllm_server import VllmEmulator
from traces.errors import TraceFormatError
from traces.replay import ReplayConfig, ReplayLog, read_replay_log, replay, replay_log_to_parquet, replay_requests


def frame(arrivals, prompts, outputs):
    return pd.DataFrame({"arrival_s": np.asarray(arrivals, dtype=float), "prompt_tokens": prompts,
                         "output_tokens": outputs})


async def _replay_with(service, requests, log, **config):
    em = VllmEmulator(service)
    await em.start()
    try:
        return await replay_requests(requests, ReplayConfig(url=em.url, **config), log), em
    finally:
        await em.stop()


def test_every_request_recorded_with_absolute_deadlines(tmp_path):
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(0.5, size=60))
    requests = frame(arrivals, rng.integers(1, 300, 60), rng.integers(1, 20, 60))
    log = tmp_path / "replay.jsonl"
    service = ServiceModel(prefill_tokens_per_s=1e5, decode_tokens_per_s=500, time_scale=50,
                           stream_interval_s=0.005)
    summary, em = asyncio.run(_replay_with(service, requests, log, time_scale=50))
    rec = summary.records
    assert summary.by_status == {"ok": 60, "http_error": 0, "timeout": 0, "error": 0}
    assert rec["index"].tolist() == list(range(60))
    # Deadlines are origin + arrival/scale, computed independently of when earlier requests went out.
    expected = np.round((arrivals - arrivals[0]) * 1e9 / 50).astype(np.int64)
    np.testing.assert_array_equal(rec["scheduled_ns"].to_numpy() - rec["scheduled_ns"].iloc[0], expected)
    assert (rec["send_error_ns"] >= 0).all()
    assert (rec["sent_ns"] - rec["scheduled_ns"] == rec["send_error_ns"]).all()
    assert rec["output_tokens"].tolist() == requests["output_tokens"].tolist()
    assert (rec["first_token_ns"] >= rec["sent_ns"]).all() and (rec["completed_ns"] >= rec["first_token_ns"]).all()
    assert em.stats.completed == 60
    # The server saw each synthesised prompt at the trace's exact length (vLLM's prompt-token counter).
    from prometheus_client.parser import text_string_to_metric_families
    served = {s.name: s.value for f in text_string_to_metric_families(em.metrics.render().decode()) for s in f.samples}
    assert served["vllm:prompt_tokens_total"] == requests["prompt_tokens"].sum()
    on_disk = read_replay_log(log)
    assert len(on_disk) == 60 and set(on_disk["index"]) == set(range(60))


def test_send_time_is_on_the_wire_after_the_connection_wait(tmp_path):
    # Four requests due at once through a one-connection pool: each one after the first waits for the previous
    # response. Ground truth is the emulator's own log: a request cannot reach the wire before the previous
    # answer's last token (the connection is busy until then) nor after the server received it.
    requests = frame([0.0, 0.0, 0.0, 0.0], [5] * 4, [10] * 4)
    service = ServiceModel(prefill_tokens_per_s=1e5, decode_tokens_per_s=100, stream_interval_s=0.0)
    summary, em = asyncio.run(_replay_with(service, requests, tmp_path / "r.jsonl", max_connections=1))
    rec = summary.records.sort_values("sent_ns")
    truth = sorted(em.stats.records)  # (received, admitted, first token, last token), one connection: in order
    assert (rec["status"] == "ok").all() and len(truth) == 4
    sent, wait = rec["sent_ns"].to_numpy(), rec["connection_wait_ns"].to_numpy(dtype=np.int64)
    received, last_token = np.asarray([t[0] for t in truth]), np.asarray([t[3] for t in truth])
    assert np.all(sent <= received)
    assert np.all(sent[1:] >= last_token[:-1])  # a stamp at hand-over (before the wait) would break this
    assert np.all(wait[1:] > 0) and np.all(wait <= rec["send_error_ns"].to_numpy())
    assert summary.connection_wait_us["max"] == pytest.approx(wait.max() / 1e3)
    on_disk = read_replay_log(tmp_path / "r.jsonl").sort_values("sent_ns")
    assert on_disk["connection_wait_ns"].tolist() == wait.tolist()


def test_sends_wait_for_no_connection_the_pool_could_open_ahead(tmp_path):
    # Nothing warmed and no spare: each request is announced to the pool when its task is made, `lookahead_s`
    # before it is due, and its connection opens then; every one finds it idle when due (the old pool opened
    # a connection only once a request found none, so every request here waited for its own handshake).
    requests = frame(np.arange(6) * 0.2, [5] * 6, [3] * 6)
    service = ServiceModel(prefill_tokens_per_s=1e5, decode_tokens_per_s=1000)
    summary, _ = asyncio.run(_replay_with(service, requests, tmp_path / "r.jsonl", warm_connections=0,
                                          spare_connections=0, lookahead_s=1.0, lead_s=1.2))
    wait = summary.records.sort_values("index")["connection_wait_ns"].to_numpy(dtype=np.int64)
    assert summary.by_status["ok"] == 6
    assert (wait == 0).all()


def test_failures_are_recorded_not_dropped(tmp_path):
    # Request 1 exceeds the context length (HTTP 400); request 2 needs 40 s of decode but times out at 1 s.
    requests = frame([0.0, 0.01, 0.02, 0.03], [10, 50000, 10, 10], [2, 2, 4000, 2])
    service = ServiceModel(prefill_tokens_per_s=1e6, decode_tokens_per_s=100, max_model_len=10000)
    summary, _ = asyncio.run(_replay_with(service, requests, tmp_path / "r.jsonl", timeout_s=1.0))
    status = summary.records.set_index("index")["status"].to_dict()
    assert status == {0: "ok", 1: "http_error", 2: "timeout", 3: "ok"}
    rec = summary.records.set_index("index")
    assert rec.loc[1, "http_status"] == 400 and "maximum context length" in rec.loc[1, "error"]
    assert len(read_replay_log(tmp_path / "r.jsonl")) == 4


def test_unreachable_endpoint_counts_errors(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    requests = frame([0.0, 0.001, 0.002], [1, 1, 1], [1, 1, 1])
    summary = replay(requests, ReplayConfig(url=f"http://127.0.0.1:{port}", timeout_s=5), tmp_path / "r.jsonl")
    assert summary.by_status["error"] == 3 and summary.requests == 3
    assert all("Connect" in e or "refused" in e for e in summary.records["error"])


def test_log_reader_tolerates_torn_tail_but_not_corruption(tmp_path):
    good = {"index": 0, "scheduled_ns": 1, "sent_ns": 2, "send_error_ns": 1, "first_token_ns": None,
            "completed_ns": 3, "prompt_tokens": 1, "output_tokens_requested": 1, "output_tokens": None,
            "status": "error", "http_status": None, "error": "x"}
    torn = tmp_path / "torn.jsonl"
    torn.write_text(json.dumps(good) + "\n" + json.dumps(good)[:25])
    assert len(read_replay_log(torn)) == 1
    out = replay_log_to_parquet(torn, tmp_path / "t.parquet")
    assert pq.read_table(tmp_path / "t.parquet").num_rows == len(out) == 1
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text(json.dumps(good) + "\n{bad\n" + json.dumps(good) + "\n")
    with pytest.raises(TraceFormatError) as info:
        read_replay_log(corrupt)
    assert info.value.line == 2


def test_replay_log_flushes_periodically_before_close(tmp_path):
    path = tmp_path / "p.jsonl"

    async def body():
        async with ReplayLog(path, interval_s=0.02) as log:
            log.append({"index": 7})
            for _ in range(500):  # the periodic flush writes it without closing the log
                await asyncio.sleep(0.01)
                if path.read_text():
                    return path.read_text()
        return None
    assert asyncio.run(body()) == '{"index":7}\n'


def test_replay_log_close_waits_for_a_periodic_write_still_running(tmp_path, monkeypatch):
    # The periodic flush's write is held in its thread while the log closes (a busy machine); its records and
    # those appended after it must all be on disk, in order. A close that cancelled the flush closed the file
    # under that thread and lost its records.
    import threading

    path = tmp_path / "p.jsonl"
    writing, release = threading.Event(), threading.Event()
    real_write = ReplayLog._write

    def held_write(self, lines):
        if not writing.is_set():
            writing.set()
            release.wait(10)
        real_write(self, lines)

    monkeypatch.setattr(ReplayLog, "_write", held_write)

    async def body():
        async with ReplayLog(path, interval_s=0.01) as log:
            log.append({"index": 0})
            await asyncio.to_thread(writing.wait, 10)  # the periodic flush has taken record 0
            log.append({"index": 1})
            threading.Timer(0.2, release.set).start()  # released only after the close has begun
        return path.read_text()

    assert asyncio.run(body()) == '{"index":0}\n{"index":1}\n'


def test_replay_through_declared_sync_windows_slows_only_those_requests(tmp_path):
    # Requests every 0.5 s of trace time; a sync window over [2, 60) s cuts capacity to 10 % (long, so that
    # requests a loaded machine delivers late still meet it).
    from devices.emulated.vllm_server import InterferenceWindow
    from devices.timing import now_ns

    windows = pd.DataFrame({"start_s": [2.0], "duration_s": [58.0], "bytes": [10**9]})
    requests = frame(np.arange(0, 6, 0.5), [10] * 12, [40] * 12)
    service = ServiceModel(prefill_tokens_per_s=1e6, decode_tokens_per_s=100, time_scale=4, stream_interval_s=0.0)

    origin_ns: list[int] = []

    async def body():
        em = VllmEmulator(service)
        await em.start()
        origin = now_ns() + int(0.2e9)
        origin_ns.append(origin)
        em.set_interference(InterferenceWindow.from_frame(windows, capacity=0.1), epoch_ns=origin)
        try:
            summary = await replay_requests(requests, ReplayConfig(url=em.url, time_scale=4, origin_ns=origin),
                                            tmp_path / "r.jsonl")
            return summary, em
        finally:
            await em.stop()
    summary, em = asyncio.run(body())
    assert (summary.records["status"] == "ok").all()
    # The emulator's own token clock (first and last token of each request, in the order received), not the
    # client's reading of it: a loaded machine delays the bytes, the window slows the service model.
    records = sorted(em.stats.records)
    assert len(records) == 12
    decode_s = np.asarray([(r[3] - r[2]) / 1e9 for r in records])

    def expected_decode_s(first_ns: int) -> float:
        # Closed form: 0.39 model s of decode work, speed 0.1 inside trace [2, 60), 1 outside, trace = 4 × wall.
        t, work = (first_ns - origin_ns[0]) * 4 / 1e9, 39 / 100
        for lo, hi, speed in ((-1e9, 2.0, 1.0), (2.0, 60.0, 0.1), (60.0, 1e9, 1.0)):
            if work > 0 and t < hi:
                t = max(t, lo)
                step = min(work / speed, hi - t)
                work, t = work - step * speed, t + step
        return (t - (first_ns - origin_ns[0]) * 4 / 1e9) / 4

    expected = np.asarray([expected_decode_s(r[2]) for r in records])
    np.testing.assert_allclose(decode_s, expected, rtol=1e-6, atol=1e-8)
    # The window was exercised: some request decoded under it (its unslowed decode is 0.39 / 4 wall s). Which
    # ones depends on when a loaded machine delivered them, so the emulator's receive times decide, not indices.
    assert np.any(decode_s > 5 * 0.39 / 4)


def test_sse_split_across_writes_crlf_and_missing_done(tmp_path):
    """A hand-made server: events split mid-line, CRLF line ends, no usage; and one stream cut short."""
    from aiohttp import web

    async def handler(request):
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        events = b"".join(b'data: {"choices": [{"text": "x"}]}\r\n\r\n' for _ in range(body["max_tokens"]))
        if len(body["prompt"]) == 1:
            events += b"data: [DONE]\r\n\r\n"
        for i in range(0, len(events), 7):  # 7-byte pieces cut through lines and events
            await resp.write(events[i:i + 7])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    async def body():
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        try:
            return await replay_requests(frame([0.0, 0.0], [1, 2], [5, 3]),
                                         ReplayConfig(url=url, warm_connections=0), tmp_path / "r.jsonl")
        finally:
            await runner.cleanup()
    rec = asyncio.run(body()).records.set_index("index")
    assert rec.loc[0, "status"] == "ok" and rec.loc[0, "output_tokens"] == 5  # counted from chunks
    assert rec.loc[1, "status"] == "error" and "[DONE]" in rec.loc[1, "error"]


def test_monotonic_timer_never_fires_early_and_keeps_order():
    from devices.timing import now_ns
    from traces._timerfd import MonotonicTimer

    async def body():
        timer = MonotonicTimer.create(asyncio.get_running_loop())
        if timer is None:
            pytest.skip("no timerfd on this platform")
        start = now_ns()
        deadlines = [start + d for d in (3_000_000, 1_000_000, 2_000_000, 1_000_000, -5)]
        fired = []

        async def wait(k, deadline):
            await timer.wait_until(deadline)
            fired.append((k, now_ns()))
        await asyncio.gather(*(wait(k, d) for k, d in enumerate(deadlines)))
        timer.close()
        return deadlines, fired
    deadlines, fired = asyncio.run(body())
    assert all(t >= deadlines[k] for k, t in fired)
    order = [k for k, _ in fired]
    assert order.index(4) < order.index(1) < order.index(2) < order.index(0)


def test_spin_fallback_replays_too(tmp_path):
    requests = frame([0.0, 0.002, 0.004, 0.004], [3, 3, 3, 3], [2, 2, 2, 2])
    service = ServiceModel(prefill_tokens_per_s=1e6, decode_tokens_per_s=1e4, stream_interval_s=0.0)
    summary, _ = asyncio.run(_replay_with(service, requests, tmp_path / "r.jsonl", use_timerfd=False))
    assert summary.by_status["ok"] == 4 and (summary.records["send_error_ns"] >= 0).all()


def test_peak_in_flight_matches_brute_force_and_sizes_the_warm_pool():
    """The most requests open at once, against a count at every start instant (ends exclusive, NaN never open);
    the warm pool is that peak of the service model's simulation plus its margin, within max_connections."""
    from analysis.serving import ServiceModel, peak_in_flight, simulate_service
    from traces.replay import warm_pool_size

    rng = np.random.default_rng(7)
    start = np.sort(rng.uniform(0, 10, 300))
    end = start + rng.exponential(0.3, 300)
    end[::17] = np.nan
    end[5] = start[6]  # touching intervals: not open together
    brute = max(int(np.sum((start <= t) & (t < end))) for t in start)
    assert peak_in_flight(start, end) == brute
    requests = frame(list(start), [100] * 300, [20] * 300)
    service = ServiceModel(prefill_tokens_per_s=1e4, decode_tokens_per_s=50, batch_slots=8)
    done = simulate_service(service, start, [100] * 300, [20] * 300)["done_s"]
    peak = peak_in_flight(start, done)
    assert 8 < peak  # requests queue for the 8 slots: in flight counts the queued too
    assert warm_pool_size(requests, service, 1000) == int(peak * 1.25) + 8
    assert warm_pool_size(requests, service, 10) == 10


def test_a_long_stream_is_read_for_its_first_token_and_usage_only():
    # The client searches only a streamed answer's last bytes for its usage: a stream far longer than that
    # tail, fed in pieces that cut through events, still yields the first token's stamp (at the piece that
    # completes the first text event, not before) and the usage event's count; without usage, the data:
    # fields counted over the whole answer.
    from traces.replay import _Answer, _read_answer

    async def read(stream: bytes, piece: int) -> tuple[dict, list[bool]]:
        record = {"first_token_ns": None}
        answer = _Answer(asyncio.get_running_loop(), record, True)
        answer.status = 200
        stamped = []
        for i in range(0, len(stream), piece):
            answer.on_body(stream[i:i + piece])
            stamped.append(record["first_token_ns"] is not None)
        _read_answer(answer, record, True)
        return record, stamped

    role = b'data: {"choices": [{"index": 0, "text": ""}]}\n\n'  # no text yet
    token = b'data: {"choices": [{"index": 0, "text": " t", "finish_reason": null}], "usage": null}\n\n'
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 900}}\n\n'
    with_usage = role + token * 900 + usage + b"data: [DONE]\n\n"
    without = role + token * 900 + b"data: [DONE]\n\n"
    (rec_u, stamped_u), (rec_n, _) = asyncio.run(read(with_usage, 13)), asyncio.run(read(without, 4096))
    assert len(with_usage) > 4 * 16384
    assert rec_u["status"] == "ok" and rec_u["output_tokens"] == 900
    first_text_end = len(role) + len(token)  # the piece holding this byte completes the first text event
    assert stamped_u.index(True) == (first_text_end - 1) // 13
    assert rec_n["status"] == "ok" and rec_n["output_tokens"] == 901  # the role event has a data: field too
