"""Emulated vLLM endpoint: OpenAI wire format, token-level service model, slots, interference windows."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import numpy as np
import pytest
from scipy import integrate

from analysis.serving import InterferenceWindow, ServiceModel
from devices.emulated.vllm_server import VllmEmulator
from devices.timing import now_ns


def run(coro):
    return asyncio.run(coro)


async def _with_server(service, body):
    emulator = VllmEmulator(service)
    await emulator.start()
    try:
        async with aiohttp.ClientSession() as session:
            return emulator, await body(emulator, session)
    finally:
        await emulator.stop()


def test_loopback_only():
    with pytest.raises(ValueError, match="127.0.0.1"):
        VllmEmulator(host="0.0.0.0")


def test_token_times_closed_form_without_windows():
    em = VllmEmulator(ServiceModel(prefill_tokens_per_s=1000, decode_tokens_per_s=50, time_scale=4))
    start = 10**12
    times = em.token_times_ns(start, prompt_tokens=200, output_tokens=5)
    expected = start + (200 / 1000 + np.arange(5) / 50) / 4 * 1e9
    np.testing.assert_allclose(times, expected, atol=2)


def test_a_streams_schedule_counts_exactly_the_tokens_done():
    # A streaming answer asks its schedule how many tokens are done at each wake (closed form at constant
    # speed); it must agree with the instants themselves to the nanosecond, or a token leaves early.
    from bisect import bisect_right

    for scale, prompt, n in ((1.0, 1, 7), (904.1368285566743, 1155, 211), (37.5, 14050, 1000), (3.0, 0, 1)):
        em = VllmEmulator(ServiceModel(prefill_tokens_per_s=20_000, decode_tokens_per_s=50, time_scale=scale))
        start = 7 * 10**12 + 123_457
        schedule = em.schedule(start, prompt, n)
        times = schedule.array()
        assert [schedule.at(k) for k in range(n)] == times.tolist()
        for t in {start - 1, *times.tolist(), *(times - 1).tolist(), *(times + 1).tolist(), int(times[-1]) + 10**9}:
            assert schedule.ready(t) == bisect_right(times.tolist(), t), (scale, t)


def test_token_times_integrate_the_capacity_profile():
    async def body():
        em = VllmEmulator(ServiceModel(prefill_tokens_per_s=100, decode_tokens_per_s=10, time_scale=2))
        epoch = now_ns()
        em.set_interference([InterferenceWindow(1.0, 2.0, 0.25), InterferenceWindow(2.5, 1.0, 0.5)], epoch)
        start = epoch + int(0.1e9)
        times = em.token_times_ns(start, prompt_tokens=50, output_tokens=40)
        return em, epoch, start, times
    em, epoch, start, times = run(body())

    def speed(t_s):  # model seconds per real second at real time t_s after the epoch (scale 2)
        trace_t = 2 * t_s
        factor = (0.25 if 1.0 <= trace_t < 3.0 else 1.0) * (0.5 if 2.5 <= trace_t < 3.5 else 1.0)
        return 2 * factor

    work = 50 / 100 + np.arange(40) / 10
    edges = [0.5, 1.25, 1.5, 1.75]
    for w, t in zip(work, times):
        lo, hi = (start - epoch) / 1e9, (t - epoch) / 1e9
        done, _ = integrate.quad(speed, lo, hi, points=[e for e in edges if lo < e < hi], limit=200)
        assert done == pytest.approx(w, abs=1e-6)
    assert em.capacity_at(epoch + int(1.3e9)) == pytest.approx(0.125)  # trace t = 2.6: both windows


def test_streaming_wire_format_and_errors():
    async def body(em, session):
        req = {"model": "emulated-llm", "prompt": [1] * 30, "max_tokens": 12, "stream": True,
               "stream_options": {"include_usage": True}}
        texts, usage, done = [], None, False
        async with session.post(em.url + "/v1/completions", json=req) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            async for line in resp.content:
                if line.startswith(b"data: "):
                    data = line[6:].strip()
                    if data == b"[DONE]":
                        done = True
                        continue
                    chunk = json.loads(data)
                    if chunk["choices"]:
                        texts.append(chunk["choices"][0]["text"])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
        statuses = []
        for bad in ({"model": "emulated-llm", "prompt": [1] * 10, "max_tokens": 200},  # over max_model_len
                    {"model": "emulated-llm", "prompt": [[1, 2], [3]], "max_tokens": 2},  # batches unsupported
                    {"model": "emulated-llm"}):  # no prompt
            async with session.post(em.url + "/v1/completions", json=bad) as resp:
                statuses.append((resp.status, (await resp.json())["error"]["type"]))
        async with session.post(em.url + "/v1/completions", data=b"{not json") as resp:
            statuses.append((resp.status, "raw"))
        async with session.post(em.url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 3}) as resp:
            plain = await resp.json()
        async with session.get(em.url + "/v1/models") as resp:
            models = await resp.json()
        async with session.get(em.url + "/stats") as resp:
            stats = await resp.json()
        return texts, usage, done, statuses, plain, models, stats

    service = ServiceModel(prefill_tokens_per_s=1e5, decode_tokens_per_s=2000, max_model_len=100,
                           stream_interval_s=0.0)
    _, (texts, usage, done, statuses, plain, models, stats) = run(_with_server(service, body))
    assert done and sum(t.count(" t") for t in texts) == 12
    assert usage == {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}
    assert statuses == [(400, "BadRequestError")] * 3 + [(400, "raw")]
    assert plain["usage"]["prompt_tokens"] == 3 and plain["choices"][0]["finish_reason"] == "length"
    assert models["data"][0]["id"] == "emulated-llm"
    assert stats["received"] == 6 and stats["rejected"] == 4 and stats["completed"] == 2


def test_batch_slots_queue_requests():
    async def body(em, session):
        async def one():
            async with session.post(em.url + "/v1/completions", json={"prompt": [1], "max_tokens": 5}) as r:
                return r.status
        return await asyncio.gather(*(one() for _ in range(6)))

    service = ServiceModel(prefill_tokens_per_s=1e6, decode_tokens_per_s=20, batch_slots=2)  # 0.2 s each
    em, statuses = run(_with_server(service, body))
    assert statuses == [200] * 6
    assert em.stats.max_running == 2 and em.stats.max_waiting >= 1
    records = sorted(em.stats.records, key=lambda r: r[1])  # by admission
    done = sorted(r[3] for r in records)
    # The k-th admission (k >= 2) waits for the (k-1)-th completion: never more than 2 in service.
    for k, rec in enumerate(records[2:], start=2):
        assert rec[1] >= done[k - 2]


def test_interference_window_cuts_slots():
    async def body(em, session):
        em.set_interference([InterferenceWindow(0.0, 30.0, 0.5)])  # from now on, half capacity
        async def one():
            async with session.post(em.url + "/v1/completions", json={"prompt": [1], "max_tokens": 3}) as r:
                return r.status
        return await asyncio.gather(*(one() for _ in range(8)))

    service = ServiceModel(prefill_tokens_per_s=1e6, decode_tokens_per_s=30, batch_slots=4)  # ~0.07 s each
    em, statuses = run(_with_server(service, body))
    assert statuses == [200] * 8 and em.stats.max_running == 2


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_no_token_and_no_slot_before_the_model_time(loop):
    # asyncio rounds timers up to whole ms, uvloop fires them up to ~0.5 ms early: the emulator keeps its
    # instants on a timerfd, so on either loop a token's bytes never leave before the model says it is done
    # and a slot never frees early. Ground truth: the emulator's own records (admitted, first, done) against
    # the client's receive stamps; 1-token requests through 2 slots force admissions on slot releases.
    from traces.replay import run_loop

    async def body(em, session):
        async def one(tokens):
            seen = []
            async with session.post(em.url + "/v1/completions",
                                    json={"prompt": [1, 2], "max_tokens": tokens, "stream": True}) as r:
                async for _ in r.content.iter_any():
                    seen.append(now_ns())
            return seen
        return await asyncio.gather(*(one(k % 3 + 1) for k in range(8)))

    service = ServiceModel(prefill_tokens_per_s=2000, decode_tokens_per_s=300, batch_slots=2, stream_interval_s=0.0)
    coro = _with_server(service, body)
    em, received = run_loop(coro) if loop == "uvloop" else run(coro)
    records = sorted(em.stats.records, key=lambda r: r[1])
    done = sorted(r[3] for r in records)
    # Each answer's first bytes after its first token's model time and its end after its completion, hence
    # the k-th earliest of each after the k-th earliest model instant.
    assert all(got >= due for got, due in zip(sorted(s[0] for s in received), sorted(r[2] for r in records)))
    assert all(got >= due for got, due in zip(sorted(s[-1] for s in received), done))
    for k, rec in enumerate(records[2:], start=2):
        assert rec[1] >= done[k - 2]  # admitted only once an earlier sequence's model time was over


def test_http_keep_alive_pipelining_and_bad_requests_on_the_wire():
    # The endpoint's own HTTP/1.1 layer, on a raw socket: two pipelined requests answered in order on one
    # connection (the stream chunked, one SSE event per token), vLLM's 404/405 bodies, a malformed request
    # answered 400 and the connection closed, and `Connection: close` honoured.
    async def exchange(port: int, data: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        got = await reader.read()  # to EOF: every exchange here ends with the server closing
        writer.close()
        return got

    def post(body: dict, close: bool = False) -> bytes:
        raw = json.dumps(body).encode()
        return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
                (b"Connection: close\r\n" if close else b"") + b"Content-Length: %d\r\n\r\n" % len(raw) + raw)

    async def body(em, session):
        pipelined = await exchange(em.port, post({"prompt": [1, 2, 3], "max_tokens": 4, "stream": True}) +
                                   post({"prompt": "a b", "max_tokens": 2}, close=True))
        missing = await exchange(em.port, b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        wrong = await exchange(em.port, b"GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        bad = await exchange(em.port, b"NOT HTTP AT ALL\r\n\r\n")
        closing = await exchange(em.port, post({"prompt": [1], "max_tokens": 2, "stream": True}, close=True))
        return pipelined, missing, wrong, bad, closing

    service = ServiceModel(prefill_tokens_per_s=1e5, decode_tokens_per_s=2000)
    em, (pipelined, missing, wrong, bad, closing) = run(_with_server(service, body))
    first, _, rest = pipelined.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in first
    assert b"content-type: text/event-stream" in first
    stream, _, second = rest.partition(b"0\r\n\r\n")  # the chunked terminator ends the first answer
    events = [e for e in stream.split(b"\n\n") if b"data: " in e]
    texts = [json.loads(e.split(b"data: ", 1)[1])["choices"][0]["text"] for e in events if b"[DONE]" not in e]
    assert texts == [" t"] * 4 and b"data: [DONE]" in events[-1]
    head, _, plain = second.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"connection: close" in head
    assert json.loads(plain)["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    assert missing.startswith(b"HTTP/1.1 404 ") and missing.endswith(b'{"detail":"Not Found"}')
    assert wrong.startswith(b"HTTP/1.1 405 ") and wrong.endswith(b'{"detail":"Method Not Allowed"}')
    assert bad.startswith(b"HTTP/1.1 400 ")
    assert b"connection: close" in closing.partition(b"\r\n\r\n")[0] and closing.endswith(b"0\r\n\r\n")
    assert b"connection: close" not in first
    assert em.stats.received == 3 and em.stats.completed == 3


@pytest.mark.parametrize("decode", [2e7 / 500_000.5, 37.0])
def test_metrics_counted_in_bulk_match_prometheus_clients_own_histograms(decode):
    # /metrics counts finished requests in one numpy pass per scrape; prometheus_client's own Histogram,
    # fed one observation at a time, must give the same buckets, counts and sums (steady and listed
    # schedules mixed: a window edge ahead of some admissions). At ×50, 2e7/500 000.5 tokens/s puts the
    # gaps at 500 000 and 500 001 ns, either side of the 0.025 s bucket bound (counted one by one); at 37
    # a steady schedule's gaps all share a bucket (counted at once).
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.parser import text_string_to_metric_families

    from devices.emulated import vllm_server as vs

    rng = np.random.default_rng(3)
    em = VllmEmulator(ServiceModel(prefill_tokens_per_s=20_000, decode_tokens_per_s=decode, time_scale=50.0))
    em._set_profile([10**12 + 40_000_000, 10**12 + 60_000_000], [1.0, 0.5, 1.0])  # half speed in between
    registry, reference = CollectorRegistry(), {}
    specs = {"ttft": ("vllm:time_to_first_token_seconds", vs.TTFT_BUCKETS),
             "tpot": ("vllm:time_per_output_token_seconds", vs.TPOT_BUCKETS),
             "e2e": ("vllm:e2e_request_latency_seconds", vs.REQUEST_LATENCY_BUCKETS),
             "queue": ("vllm:request_queue_time_seconds", vs.REQUEST_LATENCY_BUCKETS),
             "prompt": ("vllm:request_prompt_tokens", vs._1_2_5_buckets(32_768)),
             "generation": ("vllm:request_generation_tokens", vs._1_2_5_buckets(32_768))}
    for key, (name, buckets) in specs.items():
        reference[key] = Histogram(name.replace(":", "_"), "ref", buckets=buckets, registry=registry)
    kinds = set()
    for i in range(60):
        received = 10**12 + int(rng.integers(0, 80_000_000))
        admitted = received + int(rng.integers(0, 5_000_000))
        prompt, n = int(rng.integers(1, 3000)), int(rng.integers(1, 400))
        schedule = em.schedule(admitted, prompt, n)
        kinds.add(type(schedule).__name__)
        em.metrics.observe(50.0, received, admitted, schedule, prompt)
        times, to_s = schedule.array(), 50.0 / 1e9
        reference["ttft"].observe((int(times[0]) - received) * to_s)
        for gap in np.diff(times):
            reference["tpot"].observe(int(gap) * to_s)
        reference["e2e"].observe((int(times[-1]) - received) * to_s)
        reference["queue"].observe((admitted - received) * to_s)
        reference["prompt"].observe(prompt)
        reference["generation"].observe(n)
    assert kinds == {"_Steady", "_Listed"}

    def samples(text: str) -> dict:
        return {(s.name.replace(":", "_"), s.labels.get("le")): s.value
                for family in text_string_to_metric_families(text) for s in family.samples
                if not s.name.endswith("_created")}

    from prometheus_client import generate_latest

    got, want = samples(em.metrics.render().decode()), samples(generate_latest(registry).decode())
    for key, (name, _) in specs.items():
        prefix = name.replace(":", "_")
        mine = {k: v for k, v in got.items() if k[0].startswith(prefix + "_")}
        theirs = {k: v for k, v in want.items() if k[0].startswith(prefix + "_")}
        assert mine.keys() == theirs.keys() and len(mine) > 3, key
        for k, v in theirs.items():
            assert mine[k] == pytest.approx(v, rel=1e-9), (key, k)


def _fifo_oracle(em, arrivals):
    """The service model's admissions, offline: requests (t_received_ns, prompt, max_tokens) in receive order,
    FIFO into the slots; request i is admitted at the first instant t >= its receive time (and >= the
    admission before it) at which fewer than `_slots_at(t)` earlier sequences hold a slot (admitted at or before
    t, last token after t). Candidate instants: its receive time, every earlier sequence's last token, every
    window edge. Returns (admitted_ns, token instants) per request, in the emulator's own arithmetic."""
    out = []  # (admitted, times)
    for t_received, prompt, n in arrivals:
        floor = max([t_received] + [a for a, _ in out[-1:]])
        candidates = sorted({floor} | {int(t[-1]) for _, t in out if t[-1] > floor} |
                            {e for e in em._edges_list if e > floor})
        for t in candidates:
            held = sum(1 for a, times in out if a <= t < times[-1])
            if held < em._slots_at(t):
                break
        else:  # pragma: no cover - the last candidate frees every slot
            raise AssertionError("no admission instant")
        out.append((t, em.token_times_ns(t, prompt, n)))
    return out


@pytest.mark.parametrize("slots,windows", [(1, ()), (2, ()), (4, ((0.0, 0.05, 0.5),))])
def test_admission_is_the_models_fifo_queue_however_late_the_loop(slots, windows):
    # The loop is blocked on purpose (twice, 40 ms, while requests queue and slots free): the wakes that
    # free slots and admit the queue's head come late. The model does not: each request is admitted at the
    # instant its slot frees (the finishing sequence's last token, or a window edge adding slots), or at its
    # receive time if a slot is free then, and its token instants follow. The emulator's records
    # (received, admitted, first, last) must be an offline FIFO c-server's, to the nanosecond, computed from
    # the receive times it recorded and its own closed-form schedules: however late the loop is, as late wakes
    # only move bytes (an admission dated by its wake's clock is late by that wake's lateness, never early).
    import time

    sizes = [(10 + k, 2 + (5 * k) % 7) for k in range(14)]  # (prompt, max_tokens): 2-8 tokens, 2 ms each
    offsets = [0.0] * 6 + [0.02, 0.021, 0.03, 0.06, 0.061, 0.062, 0.09, 0.1]  # s after the start

    async def body(em, session):
        if windows:
            em.set_interference([InterferenceWindow(*w) for w in windows])  # half the slots for 50 ms

        async def one(k):
            await asyncio.sleep(offsets[k])
            prompt, n = sizes[k]
            async with session.post(em.url + "/v1/completions",
                                    json={"prompt": [1] * prompt, "max_tokens": n, "stream": k % 2 == 0}) as r:
                raw = await r.read()
            text = raw.decode()
            ident = text[text.index('"id": "cmpl-') + 12:].split('"', 1)[0]
            tokens = text.count('"text": " t"') if k % 2 == 0 else json.loads(text)["choices"][0]["text"].count(" t")
            return k, ident, tokens

        tasks = [asyncio.ensure_future(one(k)) for k in range(len(sizes))]
        loop = asyncio.get_running_loop()
        for at in (0.01, 0.065):
            loop.call_later(at, time.sleep, 0.04)  # the loop late on purpose
        return await asyncio.gather(*tasks)

    service = ServiceModel(prefill_tokens_per_s=1e5, decode_tokens_per_s=500, batch_slots=slots,
                           stream_interval_s=0.0)
    em, answers = run(_with_server(service, body))
    # every answer whole, with its id: `cmpl-<n>` is the n-th request the emulator received
    assert sorted(tokens for _, _, tokens in answers) == sorted(n for _, n in sizes)
    order = {int(ident): k for k, ident, _ in answers}
    assert sorted(order) == list(range(1, len(sizes) + 1))
    records = sorted(em.stats.records)  # by receive time: record i is request cmpl-(i+1)
    assert len(records) == len(sizes) and em.stats.disconnected == 0
    arrivals = [(rec[0], *sizes[order[i + 1]]) for i, rec in enumerate(records)]
    want = _fifo_oracle(em, arrivals)
    assert [rec[1] for rec in records] == [a for a, _ in want]  # admitted
    assert [rec[2] for rec in records] == [int(t[0]) for _, t in want]  # first token
    assert [rec[3] for rec in records] == [int(t[-1]) for _, t in want]  # last token
    assert any(a > rec[0] for rec, (a, _) in zip(records, want))  # requests did queue
    assert em.stats.max_running <= slots
    # vLLM's queue-time histogram counts the model's waits
    text = em.metrics.render().decode()
    total = float(text.split("vllm:request_queue_time_seconds_sum{")[1].split("} ", 1)[1].split()[0])
    assert total == pytest.approx(sum(a - rec[0] for rec, (a, _) in zip(records, want)) / 1e9, rel=1e-9,
                                  abs=1e-12)


def test_running_and_waiting_are_the_model_s_now_even_before_the_loop_ends_a_sequence():
    # /stats and /metrics count what the model says is running: the loop is blocked past a sequence's last token
    # (its end's wake cannot have run), and the depths read in that same blocked callback already count it done,
    # the queued request admitted in its slot.
    import time

    seen = {}

    async def body(em, session):
        loop = asyncio.get_running_loop()

        async def one(n):
            async with session.post(em.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": n}) as r:
                return await r.read()

        first = asyncio.ensure_future(one(200))  # 200 tokens of 2 ms: running for ~0.4 s
        while em.stats.received < 1:
            await asyncio.sleep(0.001)
        second = asyncio.ensure_future(one(200))  # waits for the one slot, then runs ~0.4 s too
        while em.stats.received < 2:
            await asyncio.sleep(0.001)

        def blocked():
            seen["before"] = (em._running, len(em._waiting), em.stats.completed)  # noqa: SLF001
            end = em._busy[0][0]  # noqa: SLF001 - the first's last token, in the model
            while now_ns() <= end:
                time.sleep(0.01)  # past it: its end's wake is due, and cannot run
            seen["completed"] = em.stats.completed
            before = now_ns()
            seen["depths"] = em._depths()  # noqa: SLF001
            # the second, admitted at the first's end, runs until its own last token (unless the sleep overran it)
            second_last = em._busy[0][0] if em._busy else 0  # noqa: SLF001
            seen["second_running"] = {now_ns() < second_last, before < second_last}

        loop.call_soon(blocked)
        await asyncio.gather(first, second)

    service = ServiceModel(prefill_tokens_per_s=1e5, decode_tokens_per_s=500, batch_slots=1, stream_interval_s=0.0)
    run(_with_server(service, body))
    assert seen["before"] == (1, 1, 0)  # the first running, the second queued
    assert seen["completed"] == 0  # the first's end had not run
    # the model: the first done, the second admitted in its slot (and still running, unless the machine was so
    # slow that the sleep overran its 0.4 s too: then done as well, never queued)
    assert seen["depths"][1] == 0
    if len(seen["second_running"]) == 1:  # (not when its last token fell within the read itself)
        assert seen["depths"][0] == int(seen["second_running"].pop())
