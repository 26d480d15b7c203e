"""Emulated vLLM-compatible endpoint (127.0.0.1 only): `POST /v1/completions` and
`POST /v1/chat/completions` (streaming SSE or not, `usage`, `stream_options.include_usage`), `GET /v1/models`,
`GET /health`, `GET /metrics` (Prometheus text with vLLM's metric names), `GET /stats`.

As vLLM does: one token per SSE chunk; `{"error": {message, type, param, code}}` bodies with 404 for an
unknown model and 400 for unsupported parameters (`n` > 1, `best_of`, `logprobs`, `echo`) or an over-long
request. Prompt length: token ids count exactly, text one token per whitespace-separated word.

Service model, per sequence and token by token: a request waits for one of `batch_slots` slots, its prompt
is prefilled at `prefill_tokens_per_s` (the first output token appears when prefill ends), then each further
token takes 1/`decode_tokens_per_s`. Declared interference windows (e.g. DiLoCo sync windows) scale both
rates and the slot count by their capacity factor while they last. Admission instants are the model's (a
waiting request's is the instant its slot frees, whenever the loop gets to it: see `_advance`). `time_scale`
speeds everything up (service times and window times alike), matching a time-scaled replay. Like vLLM with
`ignore_eos`, a request always produces exactly `max_tokens` tokens.

HTTP/1.1 on asyncio Protocols with httptools (llhttp) parsing requests, uvicorn's response headers (vLLM's
server), keep-alive and pipelining; an answer has no task of its own: admission, each stream write and the
end are callbacks on the emulator's timerfd clock, so a streamed token costs one timer entry and one socket
write (the endpoint's CPU per request is what a replay at thousands of requests/s is limited by).

Run standalone: `python -m devices.emulated.vllm_server --port 0` prints `listening 127.0.0.1:PORT`.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import itertools
import json
import time
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from email.utils import formatdate

import httptools
import numpy as np
import simdjson

from analysis.serving import InterferenceWindow, ServiceModel, capacity_profile
from devices.timing import now_ns
from traces._timerfd import MonotonicTimer

LOOPBACK = "127.0.0.1"


@dataclass
class _Stats:
    received: int = 0
    completed: int = 0
    rejected: int = 0
    disconnected: int = 0
    max_running: int = 0
    max_waiting: int = 0
    records: list = field(default_factory=list)  # (t_received_ns, t_admitted_ns, t_first_ns, t_done_ns)


class _Steady:
    """Token k done at int(start + (prefill + k·per_token) / speed) ns: model seconds of work over model seconds
    per real ns, the same arithmetic as numpy's on the whole array."""

    __slots__ = ("start", "prefill", "per_token", "speed", "n")

    def __init__(self, start: int, prefill: float, per_token: float, speed: float, n: int):
        self.start, self.prefill, self.per_token, self.speed, self.n = start, prefill, per_token, speed, n

    def at(self, k: int) -> int:
        return int(self.start + (self.prefill + k * self.per_token) / self.speed)

    def ready(self, now: int) -> int:
        """How many tokens are done at `now`."""
        k = min(self.n, max(0, int(((now - self.start) * self.speed - self.prefill) / self.per_token)))
        while k < self.n and self.at(k) <= now:  # the estimate's float rounding, settled on the exact instants
            k += 1
        while k > 0 and self.at(k - 1) > now:
            k -= 1
        return k

    def array(self) -> np.ndarray:
        work = self.prefill + np.arange(self.n) * self.per_token
        return (self.start + work / self.speed).astype(np.int64)


class _Listed:
    """Token instants listed (a window edge ahead changes the speed on the way)."""

    __slots__ = ("times", "due", "n")

    def __init__(self, times: np.ndarray):
        self.times, self.due, self.n = times, times.tolist(), len(times)

    def at(self, k: int) -> int:
        return self.due[k]

    def ready(self, now: int) -> int:
        return bisect_right(self.due, now)

    def array(self) -> np.ndarray:
        return self.times


# Histogram buckets of vLLM's V1 Prometheus logger (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)


def _1_2_5_buckets(max_value: int) -> list[int]:
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10


class _BulkHistogram:
    """A Prometheus histogram fed with arrays of observations (a custom collector), rendered as
    prometheus_client renders its own (`le` labels, `_count`, `_sum`, `_created`)."""

    def __init__(self, name: str, doc: str, buckets, labels: list[str], values: tuple[str, ...]):
        self.name, self.doc, self.labels, self.values = name, doc, labels, list(values)
        self.bounds = np.asarray(buckets, dtype=float)
        self.counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)  # the last one is +Inf
        self.total = 0.0
        self.created = time.time()

    def observe_many(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=float)
        # prometheus_client's bucket for x is the first bound >= x
        self.counts += np.bincount(np.searchsorted(self.bounds, values, side="left"), minlength=len(self.counts))
        self.total += float(values.sum())

    def add(self, buckets: np.ndarray, counts: np.ndarray, total: float) -> None:
        """`counts[i]` observations in bucket `buckets[i]` (indices as `observe_many` finds them), summing to
        `total`."""
        self.counts += np.bincount(buckets, weights=counts, minlength=len(self.counts)).astype(np.int64)
        self.total += total

    def collect(self):
        from prometheus_client.core import HistogramMetricFamily
        from prometheus_client.metrics import _use_created
        from prometheus_client.samples import Sample
        from prometheus_client.utils import floatToGoString

        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        cumulative = np.cumsum(self.counts)
        buckets = [(floatToGoString(b), int(c)) for b, c in zip(self.bounds, cumulative[:-1])]
        family.add_metric(self.values, buckets + [("+Inf", int(cumulative[-1]))], self.total)
        if _use_created:
            family.samples.append(Sample(self.name + "_created", dict(zip(self.labels, self.values)), self.created))
        yield family


class VllmMetrics:
    """`/metrics` under vLLM's V1 names and labels (`model_name`, `engine`), rendered by prometheus_client as
    vLLM itself does. Times are service-model seconds (real × time_scale), like the latencies of a replay.
    Finished requests are counted in when the metrics are next rendered, all at once (numpy): the request
    path pays a list append, and a batch of 10 000 costs milliseconds, not the ~0.2 s of per-request
    prometheus_client calls that stalled the endpoint's loop."""

    def __init__(self, model: str, max_model_len: int, queue_depths):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        self._pending: list[tuple] = []
        labels, values = ["model_name", "engine"], (model, "0")
        self._queue_depths = queue_depths
        gauge = lambda name, doc: Gauge(name, doc, labels, registry=self.registry).labels(*values)  # noqa: E731
        counter = lambda name, doc: Counter(name, doc, labels, registry=self.registry).labels(*values)  # noqa: E731

        def histogram(name, doc, buckets):
            bulk = _BulkHistogram(name, doc, buckets, labels, values)
            self.registry.register(bulk)
            return bulk

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               labels + ["finished_reason"], registry=self.registry).labels(*values, "length")
        sizes = _1_2_5_buckets(max_model_len)
        self.request_prompt = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", sizes)
        self.request_generation = histogram("vllm:request_generation_tokens",
                                            "Number of generation tokens processed.", sizes)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.tpot = histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                              TPOT_BUCKETS)  # one observation per output token after the first, as vLLM's
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)

    def observe(self, time_scale: float, received_ns: int, admitted_ns: int, tokens, prompt_tokens: int) -> None:
        """Record one finished request (`tokens`: its schedule, or its token instants as an array)."""
        if isinstance(tokens, np.ndarray):
            tokens = _Listed(tokens)
        self._pending.append((time_scale / 1e9, received_ns, admitted_ns, tokens.at(0), tokens.at(tokens.n - 1),
                              tokens.n, prompt_tokens, tokens))
        if len(self._pending) >= 10_000:  # an endpoint nobody scrapes keeps bounded memory
            self._flush()

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        cols = list(zip(*pending))
        to_s = np.array(cols[0])
        received, admitted, first, last, n, prompt = (np.array(c, dtype=np.int64) for c in cols[1:7])
        self.prompt_tokens.inc(int(prompt.sum()))
        self.generation_tokens.inc(int(n.sum()))
        self.success.inc(len(pending))
        self.request_prompt.observe_many(prompt)
        self.request_generation.observe_many(n)
        self.ttft.observe_many((first - received) * to_s)
        self.e2e.observe_many((last - received) * to_s)
        self.queue.observe_many((admitted - received) * to_s)
        # Time per output token: a steady schedule's gaps are all within a nanosecond or two of its step
        # (whole ns either side of it cover the rounding), so when that range lies in one bucket its n-1 gaps
        # go there at once and their sum is last - first; otherwise (a step on a bucket's bound, or a
        # listed schedule) gap by gap.
        step = np.array([t.per_token / t.speed if isinstance(t, _Steady) else np.nan for t in cols[7]])
        bounds = self.tpot.bounds
        low = np.searchsorted(bounds, (np.floor(step) - 1) * to_s, side="left")
        high = np.searchsorted(bounds, (np.floor(step) + 2) * to_s, side="left")
        whole = ~np.isnan(step) & (low == high)
        self.tpot.add(low[whole], (n - 1)[whole], float(((last - first) * to_s)[whole].sum()))
        for i in np.flatnonzero(~whole):
            self.tpot.observe_many(np.diff(cols[7][i].array()) * to_s[i])

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        self._flush()
        running, waiting = self._queue_depths()
        self.running.set(running)
        self.waiting.set(waiting)
        return generate_latest(self.registry)


class VllmEmulator:
    """One emulated endpoint. `await start()` binds 127.0.0.1 and returns the port; `await stop()`."""

    def __init__(self, service: ServiceModel | None = None, *, model: str = "emulated-llm", port: int = 0,
                 host: str = LOOPBACK, keep_records: bool = True):
        if host != LOOPBACK:
            raise ValueError(f"the emulator listens on {LOOPBACK} only, not {host!r}")
        self.service = service or ServiceModel()
        self.model, self.host, self.port = model, host, port
        self.keep_records = keep_records
        self.stats = _Stats()
        self.metrics = VllmMetrics(self.model, self.service.max_model_len, self._depths)
        self._epoch_ns = now_ns()
        self._windows: list[InterferenceWindow] = []
        self._edges_ns = np.empty(0, dtype=np.int64)  # window edges (real ns), sorted
        self._edge_factor = np.ones(1)  # capacity factor in each interval between edges
        self._edges_list, self._factor_list = [], [1.0]  # the same as lists: bisect per request beats numpy's call
        self._clock: MonotonicTimer | None = None  # exact wake-ups (see _at)
        self._running = 0  # slots held in the model at `_model_ns`
        self._waiting: deque[_Completion] = deque()  # admitted in order as slots free
        self._busy: list = []  # (last token ns, seq, answer) of each held slot: when the model frees it
        self._seq = itertools.count()
        self._model_ns = 0  # the instant the service model has been run to (see _advance)
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._timers: list = []  # window edges' admission wake-ups (see _at)
        self._model_json = json.dumps(self.model)
        self._interval_ns = int(self.service.stream_interval_s * 1e9)
        self._routes = {b"/v1/completions": (b"POST", self._completions),
                        b"/v1/chat/completions": (b"POST", self._chat_completions),
                        b"/metrics": (b"GET", self._metrics), b"/v1/models": (b"GET", self._models),
                        b"/health": (b"GET", self._health), b"/stats": (b"GET", self._stats)}

    # ---- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self._clock = MonotonicTimer.create(loop)
        self._server = await loop.create_server(lambda: _Connection(self), self.host, self.port, backlog=1024,
                                                reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        if self._server is not None:
            self._server.close()
            for conn in list(self._connections):
                conn.transport.abort()
            await self._server.wait_closed()
            self._server = None
        if self._clock is not None:
            self._clock.close()
            self._clock = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ---- interference ------------------------------------------------------------------------------------
    def set_interference(self, windows: list[InterferenceWindow], epoch_ns: int | None = None) -> None:
        """Declare capacity cuts; window times are trace seconds after `epoch_ns` (harness clock), divided by
        the service time scale. Overlapping windows multiply their capacities. They apply from now on: the
        model is first run to now under the capacities declared before."""
        now = now_ns()
        self._advance(now)
        self._epoch_ns = now if epoch_ns is None else int(epoch_ns)
        self._windows = sorted(windows, key=lambda w: w.start_s)
        edges_s, factors = capacity_profile(self._windows)
        scale = self.service.time_scale
        edges = [self._epoch_ns + int(t * 1e9 / scale) for t in edges_s]
        self._set_profile(edges, factors)
        for timer in self._timers:
            timer.cancel()
        # Slots may reopen when a window ends: run the model to every edge as it passes.
        self._timers = [self._at(edge, self._wake) for edge in edges]

    def _set_profile(self, edges_ns, factors) -> None:
        """Window edges (real ns, sorted) and the capacity factor before, between and after them."""
        self._edges_ns = np.asarray(edges_ns, dtype=np.int64)
        self._edge_factor = np.asarray(factors, dtype=float)
        self._edges_list, self._factor_list = self._edges_ns.tolist(), self._edge_factor.tolist()

    def capacity_at(self, t_ns: int) -> float:
        return self._factor_list[bisect_right(self._edges_list, t_ns)]

    # ---- time --------------------------------------------------------------------------------------------
    # The service model's instants (a token done, a slot free, a window edge) are kept on the harness clock to
    # the nanosecond: asyncio's timers round up to whole milliseconds and uvloop's fire up to half a
    # millisecond early, which at ×60 is 30–60 ms of model time on every token and every slot.
    def _at(self, t_ns: int, callback):
        """Run `callback()` at t_ns, never before on the timerfd (a fallback timer may fire early: callers
        check); returns a handle with cancel()."""
        if self._clock is not None:
            return self._clock.call_at(t_ns, callback)
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, (t_ns - now_ns()) / 1e9), callback)

    def _slots_at(self, t_ns: int) -> int:
        return max(1, int(self.service.batch_slots * self.capacity_at(t_ns)))

    def token_times_ns(self, start_ns: int, prompt_tokens: int, output_tokens: int) -> np.ndarray:
        """Real (harness-clock) completion time of each output token for a sequence admitted at start_ns."""
        return self.schedule(start_ns, prompt_tokens, output_tokens).array()

    def schedule(self, start_ns: int, prompt_tokens: int, output_tokens: int) -> "_Steady | _Listed":
        """The token instants of a sequence admitted at start_ns (`token_times_ns`), as a schedule a streaming
        answer reads per write: closed-form at constant speed (the common case: no numpy per request), listed
        when a window edge lies ahead."""
        svc = self.service
        if bisect_right(self._edges_list, start_ns) == len(self._edges_list):  # no window edge ahead
            speed = svc.time_scale * self.capacity_at(start_ns) / 1e9
            return _Steady(start_ns, prompt_tokens / svc.prefill_tokens_per_s, 1 / svc.decode_tokens_per_s, speed,
                           output_tokens)
        work = prompt_tokens / svc.prefill_tokens_per_s + np.arange(output_tokens) / svc.decode_tokens_per_s
        later = self._edges_ns[self._edges_ns > start_ns]
        # Speed = model seconds per real ns: piecewise constant between window edges.
        starts = np.r_[start_ns, later].astype(np.float64)
        speed = svc.time_scale / 1e9 * np.asarray([self.capacity_at(int(t)) for t in starts])
        cum = np.r_[0.0, np.cumsum(np.diff(starts) * speed[:-1])]
        seg = np.searchsorted(cum, work, side="right") - 1
        return _Listed((starts[seg] + (work - cum[seg]) / speed[seg]).astype(np.int64))

    # ---- admission ---------------------------------------------------------------------------------------
    # Admission is dated by the model, not by the wake that processes it: a slot frees at the finishing
    # sequence's last-token instant (or a window edge's instant adds slots) and the head of the queue is
    # admitted then, however late the loop gets to it; a request that finds a slot free is admitted at its
    # receive time (`t_received`, stamped when it was parsed). Every entry point first runs the model to its
    # own instant (`_advance`), slot frees and window edges in time order, so the queue's admissions are the
    # FIFO c-server's whatever the loop's lateness: a late wake delays the bytes (the writers catch up on the
    # tokens already due), never the model's instants.
    def _advance(self, t_ns: int) -> None:
        """Run the service model to t_ns: each slot freed (a held sequence's last token) and each window edge
        up to t_ns, in time order, admitting waiting requests at that instant."""
        busy, edges = self._busy, self._edges_list
        while True:
            i = bisect_right(edges, self._model_ns)
            edge = edges[i] if i < len(edges) else None
            if busy and busy[0][0] <= t_ns and (edge is None or busy[0][0] <= edge):
                t, _, answer = heapq.heappop(busy)
                self._model_ns = t
                if answer.held:  # else an abort gave the slot back already
                    answer.held = False
                    self._running -= 1
                    self._admit(t)
            elif edge is not None and edge <= t_ns:
                self._model_ns = edge
                self._admit(edge)
            else:
                break
        self._model_ns = max(self._model_ns, t_ns)

    def _wake(self) -> None:
        self._advance(now_ns())

    def _depths(self) -> tuple[int, int]:
        """(running, waiting) in the model now: a sequence whose last token has passed is not running, even if
        the loop has not yet got to its end."""
        self._advance(now_ns())
        return self._running, len(self._waiting)

    def _admit(self, t_ns: int) -> None:
        """Admit waiting requests into the slots free at model instant t_ns (the model has been run to it)."""
        slots = self._slots_at(t_ns)
        while self._waiting and self._running < slots:
            self._hold(self._waiting.popleft(), t_ns)
        self.stats.max_running = max(self.stats.max_running, self._running)

    def _hold(self, answer: "_Completion", t_ns: int) -> None:
        self._running += 1
        answer.admitted(t_ns)
        heapq.heappush(self._busy, (answer.last, next(self._seq), answer))

    def _acquire(self, answer: "_Completion") -> None:
        """`answer` admitted at its receive time if a slot is free then and nobody waits, else when its turn
        comes."""
        t = answer.t_received
        self._advance(t)
        if not self._waiting and self._running < self._slots_at(t):
            self._hold(answer, t)
            self.stats.max_running = max(self.stats.max_running, self._running)
            return
        self._waiting.append(answer)
        self.stats.max_waiting = max(self.stats.max_waiting, len(self._waiting))

    def _abort(self, answer: "_Completion") -> None:
        """The client left at now: its slot (if the model still holds it) frees now, or it leaves the queue."""
        now = now_ns()
        self._advance(now)  # it may have been admitted, or even finished, in the model before now
        if answer.held:
            answer.held = False
            self._running -= 1
            self._admit(now)
        else:
            try:
                self._waiting.remove(answer)
            except ValueError:
                pass

    # ---- HTTP --------------------------------------------------------------------------------------------
    def _handle(self, conn: "_Connection", method: bytes, url: bytes, body: bytes, keep_alive: bool) -> None:
        """Answer one request (routing as vLLM's FastAPI app: 404/405 with a `detail` body)."""
        path = url.split(b"?", 1)[0]
        route = self._routes.get(path)
        if route is None:
            conn.respond(404, _JSON, b'{"detail":"Not Found"}', keep_alive)
        elif method != route[0]:
            conn.respond(405, _JSON, b'{"detail":"Method Not Allowed"}', keep_alive)
        else:
            route[1](conn, body, keep_alive)

    def _health(self, conn, body: bytes, keep_alive: bool) -> None:
        conn.respond(200, _JSON, b"", keep_alive)

    def _models(self, conn, body: bytes, keep_alive: bool) -> None:
        conn.respond(200, _JSON, _json({"object": "list", "data": [{"id": self.model, "object": "model",
                                                                    "owned_by": "ocs-hil-emulator"}]}), keep_alive)

    def _metrics(self, conn, body: bytes, keep_alive: bool) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST

        conn.respond(200, CONTENT_TYPE_LATEST.encode(), self.metrics.render(), keep_alive)

    def _stats(self, conn, body: bytes, keep_alive: bool) -> None:
        s, (running, waiting) = self.stats, self._depths()
        conn.respond(200, _JSON, _json({"received": s.received, "completed": s.completed, "rejected": s.rejected,
                                        "disconnected": s.disconnected, "running": running,
                                        "waiting": waiting, "max_running": s.max_running,
                                        "max_waiting": s.max_waiting}), keep_alive)

    def _reject(self, conn, keep_alive: bool, status: int, message: str, param: str | None = None) -> None:
        # vLLM's ErrorResponse: OpenAI's {"error": {...}} envelope, `code` = the HTTP status.
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
        self.stats.rejected += 1
        conn.respond(status, _JSON, _json({"error": {"message": message, "type": kind, "param": param,
                                                     "code": status}}), keep_alive)

    def _parse(self, body, chat: bool) -> tuple[int, int] | tuple[int, str, str | None]:
        """(prompt_tokens, max_tokens) of a valid request, else (status, message, param) of its error."""
        if not isinstance(body, dict):
            return 400, "request body must be a JSON object", None
        model = body.get("model")
        if model is not None and model != self.model:
            return 404, f"The model `{model}` does not exist.", "model"
        for key, ok in (("n", lambda v: v in (None, 1)), ("best_of", lambda v: v in (None, 1)),
                        ("logprobs", lambda v: v in (None, False)), ("top_logprobs", lambda v: v in (None, 0)),
                        ("prompt_logprobs", lambda v: v is None), ("echo", lambda v: v in (None, False))):
            if not ok(body.get(key)):
                return 400, f"{key}={body[key]!r} is not supported by this endpoint", key
        try:
            limit = body.get("max_completion_tokens") if chat else None
            max_tokens = int(body.get("max_tokens", 16) if limit is None else limit)
            prompt_tokens = _count_messages(body["messages"]) if chat else _count_prompt(body["prompt"])
        except KeyError as exc:
            return 400, f"invalid request: missing {exc.args[0]!r}", exc.args[0]
        except (ValueError, TypeError) as exc:
            return 400, f"invalid request: {exc}", None
        if max_tokens < 1 or prompt_tokens + max_tokens > self.service.max_model_len:
            return (400, f"This model's maximum context length is {self.service.max_model_len} tokens; requested "
                         f"{prompt_tokens + max_tokens} (prompt {prompt_tokens}, max_tokens {max_tokens})",
                    "max_tokens")
        return prompt_tokens, max_tokens

    def _completions(self, conn, body: bytes, keep_alive: bool) -> None:
        self._serve(conn, body, keep_alive, chat=False)

    def _chat_completions(self, conn, body: bytes, keep_alive: bool) -> None:
        self._serve(conn, body, keep_alive, chat=True)

    def _serve(self, conn, raw: bytes, keep_alive: bool, chat: bool) -> None:
        t_received = now_ns()
        self.stats.received += 1
        try:
            body = _request_body(raw)
        except ValueError as exc:
            return self._reject(conn, keep_alive, 400, f"invalid JSON body: {exc}")
        parsed = self._parse(body, chat)
        if len(parsed) == 3:
            return self._reject(conn, keep_alive, *parsed)
        prompt_tokens, max_tokens = parsed
        stream = bool(body.get("stream", False))
        include_usage = stream and bool((body.get("stream_options") or {}).get("include_usage", False))
        answer = _Completion(self, conn, keep_alive, chat, stream, include_usage, t_received, prompt_tokens,
                             max_tokens)
        conn.current = answer
        self._acquire(answer)


class _Completion:
    """One completion from admission to its last byte, driven by the emulator's clock (no task of its own: a
    streamed answer is a callback per write). One token per SSE chunk, as vLLM streams; tokens already due when
    the writer wakes leave in one network write, still one chunk each. `stream_interval_s` > 0 coalesces
    instead (the first and the last token still leave when due, so TTFT, TPOT and end-to-end latency stay
    exact)."""

    __slots__ = ("em", "conn", "keep_alive", "chat", "stream", "include_usage", "t_received", "t_admitted",
                 "prompt_tokens", "max_tokens", "ident", "tokens", "last", "sent", "target", "handle",
                 "one", "prefix", "tail", "held", "finished")

    def __init__(self, em: VllmEmulator, conn, keep_alive: bool, chat: bool, stream: bool, include_usage: bool,
                 t_received: int, prompt_tokens: int, max_tokens: int):
        self.em, self.conn, self.keep_alive, self.chat, self.stream = em, conn, keep_alive, chat, stream
        self.include_usage, self.t_received = include_usage, t_received
        self.prompt_tokens, self.max_tokens = prompt_tokens, max_tokens
        self.ident = f"{'chatcmpl' if chat else 'cmpl'}-{em.stats.received}"
        self.handle = None
        self.held = self.finished = False

    def admitted(self, t_ns: int) -> None:
        """A slot is ours from model instant t_ns (now or earlier): the model's token instants follow from it.
        Writes due already run at once and catch up."""
        em = self.em
        self.held, self.t_admitted = True, t_ns
        self.tokens = em.schedule(t_ns, self.prompt_tokens, self.max_tokens)
        self.last = self.tokens.at(self.max_tokens - 1)
        if self.finished:  # its client left while the model caught up: the slot is given back by the abort
            return
        if not self.stream:
            self._schedule(self.last, self._whole)
            return
        self.tail = ', "usage": null}' if self.include_usage else "}"
        self.prefix = 'data: ' + self._head()[:-1] + ', "choices": [{"index": 0, ' + (
            '"delta": {"content": "' if self.chat else '"text": "')
        self.one = self._chunk(1, None)
        first = b""
        if self.chat:  # the first chunk carries the role, as OpenAI's and vLLM's do
            first = (f'data: {self._head()[:-1]}, "choices": [{{"index": 0, "delta": {{"role": "assistant", '
                     f'"content": ""}}, "logprobs": null, "finish_reason": null}}]}}\n\n').encode()
        self.conn.start_chunked(_SSE, first, self.keep_alive)
        self.sent = 0
        self._schedule(self.tokens.at(0), self._write)

    def _head(self) -> str:
        """The chunk's leading fields, as json.dumps writes them (an id and a model name need no escaping
        beyond the model's, done once)."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return (f'{{"id": "{self.ident}", "object": "{kind}", "created": {int(time.time())}, '
                f'"model": {self.em._model_json}}}')  # noqa: SLF001

    def _chunk(self, count: int, finish: str | None) -> bytes:  # TOKEN_TEXT needs no JSON escaping
        reason = "null" if finish is None else f'"{finish}"'
        close = '"}' if self.chat else '"'
        return (f'{self.prefix}{TOKEN_TEXT * count}{close}, "logprobs": null, "finish_reason": {reason}}}]'
                f'{self.tail}\n\n').encode()

    def _schedule(self, t_ns: int, callback) -> None:
        self.target = t_ns
        self.handle = self.em._at(t_ns, callback)  # noqa: SLF001 - the emulator's clock

    def _write(self) -> None:
        now = now_ns()
        if now < self.target:  # a coarse fallback timer fired early: never a token before its time
            self._schedule(self.target, self._write)
            return
        tokens, sent, n = self.tokens, self.sent, self.max_tokens
        interval = self.em._interval_ns  # noqa: SLF001
        ready = max(tokens.ready(now), sent + 1)
        if interval:
            parts = [self._chunk(ready - sent, "length" if ready == n else None)]
        else:
            parts = [self.one] * (ready - sent - (ready == n)) + ([self._chunk(1, "length")] if ready == n else [])
        self.sent = ready
        if ready < n:
            self.conn.write_chunk(b"".join(parts))
            # Coalescing never holds back the last token: the completion time stays the model's.
            self._schedule(max(tokens.at(ready), min(now + interval, self.last)), self._write)
            return
        # the last chunk, usage, [DONE] and the chunked terminator leave in one write
        if self.include_usage:
            p, m = self.prompt_tokens, self.max_tokens
            parts.append((f'data: {self._head()[:-1]}, "choices": [], "usage": {{"prompt_tokens": {p}, '
                          f'"completion_tokens": {m}, "total_tokens": {p + m}}}}}\n\n').encode())
        parts.append(b"data: [DONE]\n\n")
        self._finish()
        self.conn.write_chunk(b"".join(parts), last=True, keep_alive=self.keep_alive)

    def _whole(self) -> None:
        if now_ns() < self.target:
            self._schedule(self.target, self._whole)
            return
        text = TOKEN_TEXT * self.max_tokens
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                   "finish_reason": "length"} if self.chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"})
        body = _json({"id": self.ident, "object": "chat.completion" if self.chat else "text_completion",
                      "created": int(time.time()), "model": self.em.model, "choices": [choice],
                      "usage": self._usage()})
        self._finish()
        self.conn.respond(200, _JSON, body, self.keep_alive)

    def _usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.max_tokens,
                "total_tokens": self.prompt_tokens + self.max_tokens}

    def _finish(self) -> None:
        # The slot frees when the model says the sequence is done (its last token's instant, which this wake
        # is due at or after: running the model to now frees it there), not when a slow client has read the
        # bytes.
        em = self.em
        self.finished, self.handle = True, None
        em._advance(now_ns())  # noqa: SLF001
        em.stats.completed += 1
        em.metrics.observe(em.service.time_scale, self.t_received, self.t_admitted, self.tokens, self.prompt_tokens)
        if em.keep_records:
            em.stats.records.append((self.t_received, self.t_admitted, self.tokens.at(0), self.last))

    def abort(self) -> None:
        """The client left before the answer ended: counted, its slot (or its place in the queue) given up."""
        if self.finished:
            return
        self.finished = True
        self.em.stats.disconnected += 1
        if self.handle is not None:
            self.handle.cancel()
        self.em._abort(self)  # noqa: SLF001


_JSON = b"application/json"
_SSE = b"text/event-stream; charset=utf-8"  # what vLLM's StreamingResponse sends
_STATUS = {200: b"200 OK", 400: b"400 Bad Request", 404: b"404 Not Found", 405: b"405 Method Not Allowed",
           413: b"413 Request Entity Too Large"}
MAX_BODY = 16 << 20


def _json(payload) -> bytes:
    return json.dumps(payload).encode()


_date_cache = [0, b""]


def _date() -> bytes:
    second = int(time.time())
    if _date_cache[0] != second:
        _date_cache[:] = second, formatdate(second, usegmt=True).encode()
    return _date_cache[1]


def _head(status: int, content_type: bytes, length: int | None, keep_alive: bool) -> bytes:
    # The header set uvicorn (vLLM's server) sends.
    return b"".join((b"HTTP/1.1 ", _STATUS[status], b"\r\ndate: ", _date(), b"\r\nserver: uvicorn\r\ncontent-type: ",
                     content_type, b"\r\n",
                     b"transfer-encoding: chunked\r\n" if length is None else b"content-length: %d\r\n" % length,
                     b"" if keep_alive else b"connection: close\r\n", b"\r\n"))


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed by httptools (llhttp), answered in order (a pipelined request
    waits for the answer before it). Answers are bounded (at most max_model_len tokens), so writes go to the
    transport without waiting for it to drain."""

    def __init__(self, em: VllmEmulator):
        self.em = em
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.current: _Completion | None = None  # the answer being produced
        self.busy = False  # an answer is under way (current, or a synchronous one being written)
        self.pending: deque = deque()  # pipelined requests
        self.url, self.body, self.size, self.expect = b"", [], 0, False

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.em._connections.add(self)  # noqa: SLF001

    def connection_lost(self, exc) -> None:
        self.em._connections.discard(self)  # noqa: SLF001
        self.pending.clear()
        current, self.current = self.current, None
        if current is not None:
            current.abort()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if not self.busy:
                self.respond(400, _JSON, b'{"detail":"Invalid HTTP request received."}', False)
            else:
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url, self.body, self.size, self.expect = b"", [], 0, False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"expect" and value.lower() == b"100-continue":
            self.expect = True

    def on_headers_complete(self) -> None:
        if self.expect and not self.busy:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size <= MAX_BODY:
            self.body.append(body)

    def on_message_complete(self) -> None:
        request = (self.parser.get_method(), self.url, b"".join(self.body), self.parser.should_keep_alive(),
                   self.size > MAX_BODY)
        if self.busy:
            self.pending.append(request)
        else:
            self._start(request)

    def _start(self, request) -> None:
        method, url, body, keep_alive, too_large = request
        self.busy = True
        if too_large:
            self.respond(413, _JSON, b'{"detail":"Request body too large."}', False)
        else:
            self.em._handle(self, method, url, body, keep_alive)  # noqa: SLF001

    # writing
    def respond(self, status: int, content_type: bytes, body: bytes, keep_alive: bool) -> None:
        """A whole answer with a length."""
        self.transport.write(_head(status, content_type, len(body), keep_alive) + body)
        self._done(keep_alive)

    def start_chunked(self, content_type: bytes, first: bytes = b"", keep_alive: bool = True) -> None:
        self.transport.write(_head(200, content_type, None, keep_alive) +
                             (b"%x\r\n%s\r\n" % (len(first), first) if first else b""))

    def write_chunk(self, data: bytes, last: bool = False, keep_alive: bool = True) -> None:
        if self.transport.is_closing():
            return
        self.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data) if last else
                             b"%x\r\n%s\r\n" % (len(data), data))
        if last:
            self._done(keep_alive)

    def _done(self, keep_alive: bool) -> None:
        self.current, self.busy = None, False
        if not keep_alive:
            self.transport.close()
        elif self.pending:
            self._start(self.pending.popleft())


TOKEN_TEXT = " t"  # every emulated output token


def _request_body(raw: bytes):
    """A request's JSON: an object becomes a dict whose `prompt`, if an array, stays simdjson's view of it (its
    length and first element read in place: a prompt of token ids is most of the body, and building a
    Python int for each cost the endpoint a fifth of its CPU per request); anything else as Python values.
    A parser per request: simdjson's views pin their parser's document."""
    doc = simdjson.Parser().parse(raw)
    if not isinstance(doc, simdjson.Object):
        return doc.as_list() if isinstance(doc, simdjson.Array) else doc
    body = {}
    for key in doc.keys():
        value = doc.get(key)
        if key == "prompt" and isinstance(value, simdjson.Array):
            body[key] = value
        elif isinstance(value, simdjson.Object):
            body[key] = value.as_dict()
        elif isinstance(value, simdjson.Array):
            body[key] = value.as_list()
        else:
            body[key] = value
    return body


def _count_prompt(prompt) -> int:
    """Tokens in a completions prompt: a list of token ids counts exactly; text counts one token per
    whitespace-separated word. Batches (lists of prompts) are refused."""
    # Checking the first element tells a token list from a batch without a per-token loop.
    if isinstance(prompt, (list, simdjson.Array)) and len(prompt) and isinstance(prompt[0], int):
        return len(prompt)
    if isinstance(prompt, str):
        return len(prompt.split())
    raise ValueError("prompt must be a string or a list of token ids (batches unsupported)")


def _count_messages(messages) -> int:
    """Tokens of a chat: one per word of every message's text content (no chat-template overhead)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # content parts: only text parts carry tokens here
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise ValueError("each message needs a string content (or text parts)")
        total += len(content.split())
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Emulated vLLM-compatible endpoint on 127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="emulated-llm")
    parser.add_argument("--prefill-tokens-per-s", type=float, default=ServiceModel.prefill_tokens_per_s)
    parser.add_argument("--decode-tokens-per-s", type=float, default=ServiceModel.decode_tokens_per_s)
    parser.add_argument("--batch-slots", type=int, default=ServiceModel.batch_slots)
    parser.add_argument("--max-model-len", type=int, default=ServiceModel.max_model_len)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--stream-interval-s", type=float, default=ServiceModel.stream_interval_s)
    args = parser.parse_args(argv)
    service = ServiceModel(args.prefill_tokens_per_s, args.decode_tokens_per_s, args.batch_slots,
                           args.max_model_len, args.time_scale, args.stream_interval_s)

    async def serve() -> None:
        emulator = VllmEmulator(service, model=args.model, port=args.port, keep_records=False)
        port = await emulator.start()
        # The cyclic collector's young passes ran every ~16 requests and each walked what was in flight (a
        # streamed answer's token instants are a list): ~15 % of the endpoint's CPU per request. Rarer passes
        # walk the same in-flight state, so cost a hundredth; what lives as long as the process is frozen.
        gc.freeze()
        gc.set_threshold(100_000, 10, 10)
        print(f"listening {LOOPBACK}:{port}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await emulator.stop()

    from traces.replay import run_loop

    try:
        run_loop(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
