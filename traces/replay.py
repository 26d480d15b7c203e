"""Timed replay of inference requests against an OpenAI-compatible `/v1/completions` endpoint (vLLM or the
emulator), with a durable replay log.

Timing: request i is due at origin + arrival_s[i] / time_scale on the monotonic harness clock. Deadlines are
absolute, so lateness never accumulates. Each request gets its own task shortly before it is due. On Linux
the task waits on a timerfd (nanosecond deadlines; asyncio's own timers round up to whole milliseconds)
armed `timerfd_early_s` before the deadline, then yields to the loop until the deadline and sends at once;
elsewhere it sleeps until `spin_s` before the deadline and yields from there.

Requests are built (bytes) before their deadline and written on a keep-alive connection of
`traces.http_pool`, opened ahead: `warm_connections` before the origin, and `spare_connections` kept idle while
the replay runs. `sent_ns` is when the request went on the wire: the write of its bytes to the socket, after
any wait for a connection (every one busy, or none opened yet). That wait is recorded apart
(`connection_wait_ns`), so send error = sent_ns − scheduled_ns is the
true on-wire lateness and the connection's share of it is visible. A request that never reached the wire
(refused connection, timeout in the pool queue) keeps its hand-over time as `sent_ns` and a failed status.
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from devices.timing import now_ns
from traces._timerfd import MonotonicTimer
from traces.errors import TraceFormatError
from traces.http_pool import ConnectionPool, Response, ResponseError, request_bytes
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
    # a timerfd wakes the loop ~60 µs late (p50; p90 ~100 µs); woken earlier than needed, the task spins (yields)
    # the rest, CPU an endpoint on the same cores could use
    timerfd_early_s: float = 0.00015
    lookahead_s: float = 0.05  # a request's task is created this long before its deadline
    fsync_interval_s: float = 0.5
    pause_gc: bool = True  # cyclic GC pauses reach milliseconds; the replay makes few cycles
    warm_connections: int | None = None  # connections opened before the origin; None: `warm_pool_size` of the
    # trace under the default service model at this time scale
    spare_connections: int = 16  # while replaying, connections kept idle (opened ahead of the requests that take them)
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


def _body(model_json: bytes, ids: bytes, max_tokens: int, stream: bool) -> bytes:
    # Token ids (a JSON array text from PromptSynthesizer), not text, so the server sees exactly the trace's
    # prompt length; the body is assembled as bytes because json.dumps of long lists costs more than the send.
    extra = b',"stream":true,"stream_options":{"include_usage":true}}' if stream else b"}"
    return b"".join((b'{"model":', model_json, b',"prompt":', ids, b',"max_tokens":%d,"min_tokens":%d,'
                     b'"ignore_eos":true,"temperature":0' % (max_tokens, max_tokens), extra))


_EVENT_END = re.compile(rb"\r?\n\r?\n")
_TAIL_BYTES = 16384  # a streamed answer's end searched for its usage event (a few hundred bytes)


class _Answer(Response):
    """A completion's answer, read for what the record needs. While streamed, the arrival of the first
    text-bearing SSE event is stamped (`first_token_ns`) as the bytes are parsed; the pieces are kept as they
    came (no copy) and only the last ones are searched at the end (`tail`)."""

    __slots__ = ("record", "pending")

    def __init__(self, loop, record: dict, stream: bool):
        super().__init__(loop)
        self.record = record
        self.pending = b"" if stream else None  # bytes of events not yet searched for text; None once found

    def on_body(self, piece: bytes) -> None:
        self.chunks.append(piece)
        if self.pending is None or self.status != 200:
            return
        pending, start = self.pending + piece, 0
        while (end := _EVENT_END.search(pending, start)) is not None:  # whole events, from the first
            if _text_event(pending[start:end.start()]):
                self.record["first_token_ns"] = now_ns()
                self.pending = None
                return
            start = end.end()
        self.pending = pending[start:]

    def tail(self) -> bytes:
        """The answer's last pieces, at least `_TAIL_BYTES` of them (or all)."""
        chunks, size, k = self.chunks, 0, len(self.chunks)
        while k and size < _TAIL_BYTES:
            k -= 1
            size += len(chunks[k])
        return b"".join(chunks[k:])


class _Replayer:
    def __init__(self, config: ReplayConfig, log: ReplayLog, pool: ConnectionPool):
        self.config, self.log, self.pool = config, log, pool
        self.path = urlsplit(config.url).path.rstrip("/") + "/v1/completions"
        self.loop = asyncio.get_running_loop()
        self.in_flight = 0
        self.max_in_flight = 0
        self.limit_reached = 0
        self.results: list[dict] = []

    def request(self, body: bytes) -> bytes:
        return request_bytes("POST", self.path, self.pool.authority, body)

    async def send(self, index: int, scheduled_ns: int, prompt_tokens: int, max_tokens: int, data: bytes) -> None:
        """Send `data` (a whole request, from `request`) on a pooled connection and read its answer."""
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
        conn = answer = None
        try:
            conn = self.pool.take(expected=True)
            if conn is None:  # every connection busy (or none open yet): wait for one
                async with asyncio.timeout(cfg.timeout_s):
                    conn = await self.pool.acquire()
                record["connection_wait_ns"] = now_ns() - handed_ns
            answer = _Answer(self.loop, record, cfg.stream)
            conn.send(data, answer)
            record["sent_ns"] = now_ns()  # the request is in the socket
            # The rest of the timeout is one timer handle that fails the answer (cheaper than a timeout
            # context per request, which reschedules and uncancels a task).
            left_s = cfg.timeout_s - (record["sent_ns"] - handed_ns) / 1e9
            expiry = self.loop.call_later(max(0.0, left_s), _expire, answer)
            try:
                await answer.done
            finally:
                expiry.cancel()
            _read_answer(answer, record, cfg.stream)
        except TimeoutError:
            record["status"], record["error"] = "timeout", f"no complete answer within {cfg.timeout_s} s"
        except (ResponseError, OSError, ValueError) as exc:
            record["status"], record["error"] = "error", f"{type(exc).__name__}: {exc}"[:300]
        finally:
            if answer is not None and not (answer.done.done() and not answer.done.cancelled()
                                           and answer.done.exception() is None):
                conn.abort()  # left mid-answer: the connection is out of step
            record["completed_ns"] = now_ns()
            if record["sent_ns"] is None:  # never on the wire
                record["sent_ns"] = handed_ns
            record["send_error_ns"] = record["sent_ns"] - scheduled_ns
            self.in_flight -= 1
            self.log.append(record)
            self.results.append(record)


def _expire(answer: _Answer) -> None:
    if not answer.done.done():
        answer.done.set_exception(TimeoutError())


def _read_answer(answer: _Answer, record: dict, stream: bool) -> None:
    body = answer.tail() if stream and answer.status == 200 else answer.body()
    record["http_status"] = answer.status
    if answer.status != 200:
        record["status"], record["error"] = "http_error", body.decode("utf-8", "replace")[:300]
    elif not stream:
        payload = orjson.loads(body)
        record["first_token_ns"] = now_ns()
        record["output_tokens"] = int((payload.get("usage") or {}).get("completion_tokens", 0))
        record["status"] = "ok"
    else:
        # `body` is the answer's last bytes; only the usage event is decoded, from the end. Servers may
        # coalesce tokens into one chunk: usage is exact, the event count (the whole answer searched, only
        # when there is no usage) a lower bound (neither the usage-only event nor [DONE] carries a token).
        done = body.rfind(b"[DONE]") >= 0  # from the end, where it is
        usage_tokens = _usage_tokens(body) if done else None
        record["output_tokens"] = (usage_tokens if usage_tokens is not None
                                   else max(0, answer.body().count(b"data:") - done))
        if done:
            record["status"] = "ok"
        else:
            record["status"], record["error"] = "error", "stream ended without [DONE]"


def _text_event(event: bytes) -> bool:
    """Whether one SSE event is a completion chunk that carries text (its `data:` line decoded)."""
    for line in event.splitlines():
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data == b"[DONE]":
                return False
            choices = orjson.loads(data).get("choices")
            return bool(choices and choices[0].get("text"))
    return False


def _usage_tokens(body: bytes) -> int | None:
    """completion_tokens of the usage object among the stream's final events (it follows the last text
    chunk), if any; decoded from the end, so usually two events."""
    text = b"\n" + body
    end = len(text)
    while (start := text.rfind(b"\ndata:", 0, end)) >= 0:
        line = text[start + 6:end].strip()
        end = start
        if line == b"[DONE]":
            continue
        payload = orjson.loads(line)
        if isinstance(payload.get("usage"), dict):
            return int(payload["usage"].get("completion_tokens", 0))
        if payload.get("choices"):
            return None
    return None


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
    spin_ns = int(config.spin_s * 1e9)
    model_json = json.dumps(config.model).encode()
    timer_early_ns = int(config.timerfd_early_s * 1e9)
    warm = config.warm_connections
    if warm is None:
        from analysis.serving import ServiceModel

        warm = warm_pool_size(requests, ServiceModel(time_scale=config.time_scale), config.max_connections)
    async with ReplayLog(log_path, config.fsync_interval_s) as log:
        pool = ConnectionPool(config.url, config.max_connections, spare=config.spare_connections)
        try:
            replayer = _Replayer(config, log, pool)
            origin = config.origin_ns if config.origin_ns is not None else now_ns() + int(config.lead_s * 1e9)
            await _warm_up(pool, warm, origin)
            tasks = set()

            timer = MonotonicTimer.create(asyncio.get_running_loop()) if config.use_timerfd else None

            async def timed(i: int, deadline: int) -> None:
                # The request is built before the wait (the task starts `lookahead` ahead), never on the send path.
                max_tokens = max(1, int(outputs[i]))
                data = replayer.request(_body(model_json, prompts_text.json_ids(i), max_tokens, config.stream))
                if timer is not None:
                    # Wake a little early (a sleeping process takes ~0.1 ms to run again), then yield briefly.
                    await timer.wait_until(deadline - timer_early_ns)
                else:
                    coarse = (deadline - spin_ns - now_ns()) / 1e9
                    if coarse > 0:
                        await asyncio.sleep(coarse)
                while now_ns() < deadline:
                    await asyncio.sleep(0)
                await replayer.send(i, deadline, int(prompts[i]), max_tokens, data)

            # Each request's own task waits for its deadline and sends at once; a feeder creates the tasks
            # `lookahead` ahead, so the feeder's own lateness never reaches the send (and there is no
            # extra loop turn between "due" and "sent", as there would be with one scheduler task).
            lookahead_ns = int(config.lookahead_s * 1e9)
            for i in range(len(arrival_ns)):
                deadline = origin + int(arrival_ns[i])
                ahead = (deadline - lookahead_ns - now_ns()) / 1e9
                if ahead > 0:
                    await asyncio.sleep(ahead)
                pool.expect()  # its connection opens now if none is spare, `lookahead` before it is due
                task = asyncio.create_task(timed(i, deadline))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*list(tasks), return_exceptions=True)
            if timer is not None:
                timer.close()
            finished = now_ns()
        finally:
            await pool.close()
    records = pd.DataFrame(replayer.results, columns=list(REPLAY_LOG_COLUMNS)).sort_values("index")
    return _summarise(records, origin, finished, replayer, str(log_path))


async def _warm_up(pool: ConnectionPool, count: int, origin: int) -> None:
    """Open `count` keep-alive connections ahead of the first deadline so early sends skip the TCP handshake.
    Best effort: a short lead opens what it can (the pool opens the rest as requests need them)."""
    budget = (origin - now_ns()) / 1e9 - 0.01
    if budget <= 0 or count <= 0:
        return
    try:
        async with asyncio.timeout(budget):
            await pool.warm(count)
    except TimeoutError:
        pass


def warm_pool_size(requests: pd.DataFrame, service, max_connections: int) -> int:
    """Keep-alive connections to open before the first request: the most requests the service model has in
    flight at once over the trace (the emulated endpoint's own model; an estimate for a real endpoint), with
    a quarter and 8 more for a client that reads answers late, within `max_connections`."""
    from analysis.serving import peak_in_flight, simulate_service

    arrival = requests["arrival_s"].to_numpy(dtype=float)
    done = simulate_service(service, arrival, requests["prompt_tokens"], requests["output_tokens"])["done_s"]
    return min(max_connections, int(peak_in_flight(arrival, done) * 1.25) + 8)


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
