"""Timed replay of inference requests against an OpenAI-compatible `/v1/completions` endpoint (vLLM or the
emulator), with a durable replay log.

Timing: request i is due at origin + arrival_s[i] / time_scale on the monotonic harness clock. Deadlines are
absolute, so lateness never accumulates. Each request gets its own task shortly before it is due. On Linux
the task waits on a timerfd (nanosecond deadlines; asyncio's own timers round up to whole milliseconds)
armed `timerfd_early_s` before the deadline, then yields to the loop until the deadline and sends at once;
elsewhere it sleeps until `spin_s` before the deadline and yields from there.

`sent_ns` is when the request went on the wire: aiohttp's tracing signal for the body's write to the socket,
after any wait for a free pooled connection or a new one's handshake. Those waits are recorded apart
(`connection_wait_ns`, the pool queue plus connection set-up), so send error = sent_ns − scheduled_ns is the
true on-wire lateness and the connection's share of it is visible. A request that never reached the wire
(refused connection, timeout in the pool queue) keeps its hand-over time as `sent_ns` and a failed status.
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from yarl import URL

from devices.timing import now_ns
from traces._timerfd import MonotonicTimer
from traces.errors import TraceFormatError
from traces.requests import PromptSynthesizer

REPLAY_LOG_COLUMNS = ("index", "scheduled_ns", "sent_ns", "send_error_ns", "connection_wait_ns", "first_token_ns",
                      "completed_ns", "prompt_tokens", "output_tokens_requested", "output_tokens", "status",
                      "http_status", "error")
STATUSES = ("ok", "http_error", "timeout", "error")


@dataclass(frozen=True)
class ReplayConfig:
    url: str  # base URL, e.g. http://127.0.0.1:8000
    model: str = "emulated-llm"
    time_scale: float = 1.0  # > 1 replays faster than recorded
    timeout_s: float = 60.0  # per request, send to last byte
    max_connections: int = 256
    stream: bool = True
    lead_s: float = 0.2  # origin = start + lead_s when origin_ns is not given
    origin_ns: int | None = None  # share it with an emulator's interference epoch
    spin_s: float = 0.0015  # without timerfd: asyncio timers round up to 1 ms, so the last stretch is spun
    use_timerfd: bool = True  # Linux: wake on time via a timerfd instead of spinning
    timerfd_early_s: float = 0.0003
    lookahead_s: float = 0.05  # a request's task is created this long before its deadline
    fsync_interval_s: float = 0.5
    pause_gc: bool = True  # cyclic GC pauses reach milliseconds; the replay makes few cycles
    warm_connections: int = 16  # open this many keep-alive connections (GET /health) before the origin
    prompt_seed: int = 0  # seeds the synthesised prompt contents (traces.requests.PromptSynthesizer)

    def __post_init__(self):
        if self.time_scale <= 0 or self.timeout_s <= 0 or self.max_connections < 1:
            raise ValueError("time_scale and timeout_s must be > 0, max_connections >= 1")


@dataclass
class ReplaySummary:
    requests: int
    by_status: dict[str, int]
    send_error_us: dict[str, float]  # p50, p99, max: on-wire send − scheduled
    connection_wait_us: dict[str, float]  # p50, p99, max: part of it spent waiting for a (new) connection
    ttft_ms: dict[str, float]
    duration_s: float
    max_in_flight: int
    connection_limit_reached: int  # requests sent while every connection was busy (they queued in the client)
    log_path: str
    records: pd.DataFrame = field(repr=False)


class ReplayLog:
    """Append-only JSON Lines; records are buffered and written + fsynced every `interval_s` (off the
    event loop) and on close. A crash loses at most the last interval."""

    def __init__(self, path: str | Path, interval_s: float = 0.5):
        self.path = Path(path)
        self.interval_s = interval_s
        self._fh = open(self.path, "ab")
        self._pending: list[bytes] = []
        self._task: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None

    def append(self, record: dict) -> None:
        self._pending.append(orjson.dumps(record) + b"\n")

    def _write(self, lines: list[bytes]) -> None:
        self._fh.write(b"".join(lines))
        self._fh.flush()
        os.fsync(self._fh.fileno())

    async def _flush(self) -> None:
        lines, self._pending = self._pending, []
        if lines:
            await asyncio.to_thread(self._write, lines)

    async def _periodic(self) -> None:
        # Stopped by an event, never cancelled: a cancel lands in the awaited write, whose thread goes on
        # writing after close() (its lines lost, more so the busier the machine).
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval_s)
            except TimeoutError:
                pass
            await self._flush()

    async def __aenter__(self) -> "ReplayLog":
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._periodic())
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            self._stop.set()
            await self._task  # its last round flushes what is pending; the file is closed only after it
        finally:
            await self._flush()
            self._fh.close()


def read_replay_log(path: str | Path) -> pd.DataFrame:
    """Replay log as a DataFrame. A truncated last line (crash mid-write) is ignored; any other bad line is
    an error naming file and line."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        lines = fh.readlines()
    for lineno, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            rows.append(json.loads(text))
        except json.JSONDecodeError as exc:
            if lineno == len(lines) and not text.endswith("\n"):
                break
            raise TraceFormatError(f"invalid JSON: {exc.msg}", file=str(path), line=lineno) from exc
    frame = pd.DataFrame(rows, columns=list(REPLAY_LOG_COLUMNS))
    for col in ("index", "scheduled_ns", "sent_ns", "send_error_ns", "prompt_tokens", "output_tokens_requested"):
        frame[col] = frame[col].astype(np.int64)
    for col in ("connection_wait_ns", "first_token_ns", "completed_ns", "output_tokens", "http_status"):
        frame[col] = frame[col].astype("Int64")
    return frame


def replay_log_to_parquet(jsonl_path: str | Path, parquet_path: str | Path) -> pd.DataFrame:
    frame = read_replay_log(jsonl_path)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), str(parquet_path))
    return frame


def _body(model: str, ids: bytes, max_tokens: int, stream: bool) -> bytes:
    # Token ids (a JSON array text from PromptSynthesizer), not text, so the server sees exactly the trace's
    # prompt length; the body is assembled as bytes because json.dumps of long lists costs more than the send.
    extra = ',"stream":true,"stream_options":{"include_usage":true}' if stream else ""
    return (f'{{"model":{json.dumps(model)},"prompt":'.encode() + ids +
            f',"max_tokens":{max_tokens},"min_tokens":{max_tokens},"ignore_eos":true,"temperature":0{extra}}}'.encode())


_JSON_HEADERS = {"Content-Type": "application/json"}


class _Replayer:
    def __init__(self, config: ReplayConfig, log: ReplayLog):
        self.config, self.log = config, log
        self.url = URL(config.url.rstrip("/") + "/v1/completions")  # parsed once, not per request
        self.in_flight = 0
        self.max_in_flight = 0
        self.limit_reached = 0
        self.results: list[dict] = []

    async def send(self, session: aiohttp.ClientSession, index: int, scheduled_ns: int, prompt_tokens: int,
                   max_tokens: int, body: bytes) -> None:
        cfg = self.config
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.in_flight > cfg.max_connections:
            self.limit_reached += 1
        record = {"index": index, "scheduled_ns": scheduled_ns, "sent_ns": None, "send_error_ns": None,
                  "connection_wait_ns": 0, "first_token_ns": None, "completed_ns": None,
                  "prompt_tokens": prompt_tokens, "output_tokens_requested": max_tokens, "output_tokens": None,
                  "status": "error", "http_status": None, "error": None}
        handed_ns = now_ns()
        try:
            async with asyncio.timeout(cfg.timeout_s):
                async with session.post(self.url, data=body, headers=_JSON_HEADERS,
                                        trace_request_ctx=record) as resp:
                    record["http_status"] = resp.status
                    if resp.status != 200:
                        text = await resp.text()
                        record["status"], record["error"] = "http_error", text[:300]
                    elif cfg.stream:
                        await self._read_stream(resp, record)
                    else:
                        payload = await resp.json(content_type=None)
                        record["first_token_ns"] = now_ns()
                        record["output_tokens"] = int((payload.get("usage") or {}).get("completion_tokens", 0))
                        record["status"] = "ok"
        except TimeoutError:
            record["status"], record["error"] = "timeout", f"no complete answer within {cfg.timeout_s} s"
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            record["status"], record["error"] = "error", f"{type(exc).__name__}: {exc}"[:300]
        finally:
            record["completed_ns"] = now_ns()
            if record["sent_ns"] is None:  # never on the wire
                record["sent_ns"] = handed_ns
            record["send_error_ns"] = record["sent_ns"] - scheduled_ns
            self.in_flight -= 1
            self.log.append(record)
            self.results.append(record)

    @staticmethod
    async def _read_stream(resp: aiohttp.ClientResponse, record: dict) -> None:
        # Whole network reads, cut at event boundaries and searched with bytes methods (C): events are
        # decoded only until the first text-bearing one, and the usage event once, at the end. Decoding every
        # token's event cost ~4 µs a token, most of a request's client CPU at ~200 tokens a request.
        events_seen, usage_tokens, done, pending, previous = 0, None, False, b"", b""
        async for data in resp.content.iter_any():
            pending += data
            cut = max(pending.rfind(b"\n\n"), pending.rfind(b"\r\n\r\n"))
            if cut < 0:
                continue
            events, pending = pending[:cut], pending[cut:]
            events_seen += events.count(b"data:")
            if record["first_token_ns"] is None and _first_text_event(events):
                record["first_token_ns"] = now_ns()
            if b"[DONE]" in events:
                done = True
                usage_tokens = _usage_tokens(previous + events)
            previous = events
        # Servers may coalesce tokens into one chunk; usage is exact, the event count a lower bound (neither
        # the usage-only event nor [DONE] carries a token).
        record["output_tokens"] = usage_tokens if usage_tokens is not None else max(0, events_seen - done)
        if done:
            record["status"] = "ok"
        else:
            record["status"], record["error"] = "error", "stream ended without [DONE]"


def _first_text_event(events: bytes) -> bool:
    """Whether some completion chunk among `events` (whole SSE events) carries text."""
    for line in events.split(b"\n"):
        if line.startswith(b"data:") and b"[DONE]" not in line:
            choices = orjson.loads(line[5:]).get("choices")
            if choices and choices[0].get("text"):
                return True
    return False


def _usage_tokens(events: bytes) -> int | None:
    """completion_tokens of the usage object among the stream's final events (it follows the last text
    chunk), if any; the events are decoded from the end, so usually two."""
    for line in reversed(events.split(b"\n")):
        if not line.startswith(b"data:") or b"[DONE]" in line:
            continue
        payload = orjson.loads(line[5:])
        if isinstance(payload.get("usage"), dict):
            return int(payload["usage"].get("completion_tokens", 0))
        if payload.get("choices"):
            return None
    return None


def wire_trace_config() -> aiohttp.TraceConfig:
    """aiohttp tracing that stamps a request's record (its `trace_request_ctx`): `sent_ns` when the body is
    written to the socket, `connection_wait_ns` += time queued for a pooled connection or opening one."""
    config = aiohttp.TraceConfig()

    async def on_chunk_sent(session, ctx, params) -> None:
        record = ctx.trace_request_ctx
        if record is not None and record["sent_ns"] is None:  # None: a warm-up request, not a replayed one
            record["sent_ns"] = now_ns()

    async def wait_start(session, ctx, params) -> None:
        ctx.wait_from = now_ns()

    async def wait_end(session, ctx, params) -> None:
        if ctx.trace_request_ctx is not None:
            ctx.trace_request_ctx["connection_wait_ns"] += now_ns() - ctx.wait_from

    config.on_request_chunk_sent.append(on_chunk_sent)
    for start, end in ((config.on_connection_queued_start, config.on_connection_queued_end),
                       (config.on_connection_create_start, config.on_connection_create_end)):
        start.append(wait_start)
        end.append(wait_end)
    return config


def prepared_prompts(requests: pd.DataFrame, config: ReplayConfig) -> PromptSynthesizer:
    """Every request's prompt built ahead: a caller that fixes `origin_ns` builds them before taking it (a
    Mooncake segment's prompts take ~0.5 s), so the replay's lead time is not spent on them."""
    return PromptSynthesizer(requests, seed=config.prompt_seed).prepare()


async def replay_requests(requests: pd.DataFrame, config: ReplayConfig, log_path: str | Path,
                          prompts: PromptSynthesizer | None = None) -> ReplaySummary:
    """Replay `requests` (canonical frame) in real time; every request gets a log record. `prompts`: from
    `prepared_prompts` (built here, before the origin is taken, when not given)."""
    prompts = prompts or prepared_prompts(requests, config)
    was_enabled = gc.isenabled()
    if config.pause_gc:
        gc.collect()
        gc.disable()
    try:
        return await _replay(requests, config, log_path, prompts)
    finally:
        if was_enabled:
            gc.enable()


async def _replay(requests: pd.DataFrame, config: ReplayConfig, log_path: str | Path,
                  prompts_text: PromptSynthesizer) -> ReplaySummary:
    arrival_ns = np.round(requests["arrival_s"].to_numpy(dtype=float) * 1e9 / config.time_scale).astype(np.int64)
    arrival_ns -= arrival_ns[0] if len(arrival_ns) else 0
    prompts = requests["prompt_tokens"].to_numpy(dtype=np.int64)
    outputs = requests["output_tokens"].to_numpy(dtype=np.int64)
    connector = aiohttp.TCPConnector(limit=config.max_connections, force_close=False)
    spin_ns = int(config.spin_s * 1e9)
    timer_early_ns = int(config.timerfd_early_s * 1e9)
    async with ReplayLog(log_path, config.fsync_interval_s) as log:
        replayer = _Replayer(config, log)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                         trace_configs=[wire_trace_config()]) as session:
            origin = config.origin_ns if config.origin_ns is not None else now_ns() + int(config.lead_s * 1e9)
            await _warm_up(session, config, origin)
            tasks = set()

            timer = MonotonicTimer.create(asyncio.get_running_loop()) if config.use_timerfd else None

            async def timed(i: int, deadline: int) -> None:
                # The body is built before the wait (the task starts `lookahead` ahead), never on the send path.
                max_tokens = max(1, int(outputs[i]))
                body = _body(config.model, prompts_text.json_ids(i), max_tokens, config.stream)
                if timer is not None:
                    # Wake a little early (a sleeping process takes ~0.1 ms to run again), then yield briefly.
                    await timer.wait_until(deadline - timer_early_ns)
                else:
                    coarse = (deadline - spin_ns - now_ns()) / 1e9
                    if coarse > 0:
                        await asyncio.sleep(coarse)
                while now_ns() < deadline:
                    await asyncio.sleep(0)
                await replayer.send(session, i, deadline, int(prompts[i]), max_tokens, body)

            # Each request's own task waits for its deadline and sends at once; a feeder creates the tasks
            # `lookahead` ahead, so the feeder's own lateness never reaches the send (and there is no
            # extra loop turn between "due" and "sent", as there would be with one scheduler task).
            lookahead_ns = int(config.lookahead_s * 1e9)
            for i in range(len(arrival_ns)):
                deadline = origin + int(arrival_ns[i])
                ahead = (deadline - lookahead_ns - now_ns()) / 1e9
                if ahead > 0:
                    await asyncio.sleep(ahead)
                task = asyncio.create_task(timed(i, deadline))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*list(tasks), return_exceptions=True)
            if timer is not None:
                timer.close()
            finished = now_ns()
    records = pd.DataFrame(replayer.results, columns=list(REPLAY_LOG_COLUMNS)).sort_values("index")
    return _summarise(records, origin, finished, replayer, str(log_path))


async def _warm_up(session: aiohttp.ClientSession, config: ReplayConfig, origin: int) -> None:
    """Open keep-alive connections ahead of the first deadline so early sends skip the TCP handshake.
    Best effort: endpoints without /health, or a short lead, just skip it."""
    budget = (origin - now_ns()) / 1e9 - 0.01
    count = min(config.warm_connections, config.max_connections)
    if budget <= 0 or count <= 0:
        return

    async def one() -> None:
        async with session.get(config.url.rstrip("/") + "/health") as resp:
            await resp.read()
    try:
        async with asyncio.timeout(budget):
            await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    except TimeoutError:
        pass


def replay(requests: pd.DataFrame, config: ReplayConfig, log_path: str | Path) -> ReplaySummary:
    """Blocking wrapper around `replay_requests` (one event loop)."""
    return run_loop(replay_requests(requests, config, log_path))


def run_loop(main):
    """`asyncio.run(main)` on uvloop where it is installed: a replay's and an emulated endpoint's CPU per request
    is largely the event loop's and its socket transports', which uvloop runs in C (≈ 20 % less per request)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def _summarise(records: pd.DataFrame, origin: int, finished: int, replayer: _Replayer, log_path: str
               ) -> ReplaySummary:
    err = records["send_error_ns"].to_numpy(dtype=float) / 1e3
    wait = records["connection_wait_ns"].to_numpy(dtype=float) / 1e3
    ok = records[records["status"] == "ok"]
    ttft = (ok["first_token_ns"].astype(float) - ok["sent_ns"].astype(float)).to_numpy() / 1e6
    pct = lambda a, q: float(np.percentile(a, q)) if len(a) else float("nan")  # noqa: E731
    return ReplaySummary(
        requests=len(records),
        by_status={s: int((records["status"] == s).sum()) for s in STATUSES},
        send_error_us={"p50": pct(err, 50), "p99": pct(err, 99), "max": float(err.max()) if len(err) else float("nan")},
        connection_wait_us={"p50": pct(wait, 50), "p99": pct(wait, 99),
                            "max": float(wait.max()) if len(wait) else float("nan")},
        ttft_ms={"p50": pct(ttft, 50), "p99": pct(ttft, 99)},
        duration_s=(finished - origin) / 1e9, max_in_flight=replayer.max_in_flight,
        connection_limit_reached=replayer.limit_reached, log_path=log_path, records=records)
