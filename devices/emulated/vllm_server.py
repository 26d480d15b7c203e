"""Emulated vLLM-compatible endpoint (aiohttp, 127.0.0.1 only): `POST /v1/completions` and
`POST /v1/chat/completions` (streaming SSE or not, `usage`, `stream_options.include_usage`), `GET /v1/models`,
`GET /health`, `GET /metrics` (Prometheus text with vLLM's metric names), `GET /stats`.

As vLLM does: one token per SSE chunk; `{"error": {message, type, param, code}}` bodies with 404 for an
unknown model and 400 for unsupported parameters (`n` > 1, `best_of`, `logprobs`, `echo`) or an over-long
request. Prompt length: token ids count exactly, text one token per whitespace-separated word.

Service model, per sequence and token by token: a request waits for one of `batch_slots` slots, its prompt
is prefilled at `prefill_tokens_per_s` (the first output token appears when prefill ends), then each further
token takes 1/`decode_tokens_per_s`. Declared interference windows (e.g. DiLoCo sync windows) scale both
rates and the slot count by their capacity factor while they last. `time_scale` speeds everything up
(service times and window times alike), matching a time-scaled replay. Like vLLM with `ignore_eos`,
a request always produces exactly `max_tokens` tokens.

Run standalone: `python -m devices.emulated.vllm_server --port 0` prints `listening 127.0.0.1:PORT`.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import orjson
from aiohttp import web

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
    """A Prometheus histogram fed with arrays of observations (a custom collector)."""

    def __init__(self, name: str, doc: str, buckets, labels: list[str], values: tuple[str, ...]):
        self.name, self.doc, self.labels, self.values = name, doc, labels, list(values)
        self.bounds = np.asarray(buckets, dtype=float)
        self.counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)  # the last one is +Inf
        self.total = 0.0

    def observe_many(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=float)
        self.counts += np.bincount(np.searchsorted(self.bounds, values, side="left"), minlength=len(self.counts))
        self.total += float(values.sum())

    def collect(self):
        from prometheus_client.core import HistogramMetricFamily

        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        cumulative = np.cumsum(self.counts)
        buckets = [(repr(float(b)), int(c)) for b, c in zip(self.bounds, cumulative[:-1])]
        family.add_metric(self.values, buckets + [("+Inf", int(cumulative[-1]))], self.total)
        yield family


class VllmMetrics:
    """`/metrics` under vLLM's V1 names and labels (`model_name`, `engine`), rendered by prometheus_client as
    vLLM itself does. Times are service-model seconds (real × time_scale), like the latencies of a replay."""

    def __init__(self, model: str, max_model_len: int, queue_depths):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self._pending: list[tuple] = []
        labels, values = ["model_name", "engine"], (model, "0")
        self._queue_depths = queue_depths
        gauge = lambda name, doc: Gauge(name, doc, labels, registry=self.registry).labels(*values)  # noqa: E731
        counter = lambda name, doc: Counter(name, doc, labels, registry=self.registry).labels(*values)  # noqa: E731

        def histogram(name, doc, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry).labels(*values)

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
        # One observation per output token, as vLLM makes them: counted in bulk (numpy) by a collector,
        # because prometheus_client's per-call observe would cost more than the request itself.
        self.tpot = _BulkHistogram("vllm:time_per_output_token_seconds",
                                   "Histogram of time per output token in seconds.", TPOT_BUCKETS, labels, values)
        self.registry.register(self.tpot)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)

    def observe(self, time_scale: float, received_ns: int, admitted_ns: int, token_ns: np.ndarray,
                prompt_tokens: int) -> None:
        """Record one finished request; counted into the metrics when they are next rendered (a scrape),
        so the request path pays a list append rather than a dozen metric updates."""
        self._pending.append((time_scale, received_ns, admitted_ns, token_ns, prompt_tokens))
        if len(self._pending) >= 10_000:  # an endpoint nobody scrapes keeps bounded memory
            self._flush()

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for time_scale, received_ns, admitted_ns, token_ns, prompt_tokens in pending:
            to_s = time_scale / 1e9
            self.prompt_tokens.inc(prompt_tokens)
            self.generation_tokens.inc(len(token_ns))
            self.success.inc()
            self.request_prompt.observe(prompt_tokens)
            self.request_generation.observe(len(token_ns))
            self.ttft.observe((int(token_ns[0]) - received_ns) * to_s)
            self.tpot.observe_many(np.diff(token_ns) * to_s)
            self.e2e.observe((int(token_ns[-1]) - received_ns) * to_s)
            self.queue.observe((admitted_ns - received_ns) * to_s)

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
        self.metrics = VllmMetrics(self.model, self.service.max_model_len, lambda: (self._running,
                                                                                    len(self._waiting)))
        self._epoch_ns = now_ns()
        self._windows: list[InterferenceWindow] = []
        self._edges_ns = np.empty(0, dtype=np.int64)  # window edges (real ns), sorted
        self._edge_factor = np.ones(1)  # capacity factor in each interval between edges
        self._edges_list, self._factor_list = [], [1.0]  # the same as lists: bisect per request beats numpy's call
        self._clock: MonotonicTimer | None = None  # exact wake-ups (see _at)
        self._running = 0
        self._waiting: deque[asyncio.Future] = deque()
        self._runner: web.AppRunner | None = None
        self._timers: list = []  # window edges' admission wake-ups (see _at)

    # ---- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> int:
        self._clock = MonotonicTimer.create(asyncio.get_running_loop())
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/stats", self._stats)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=1024, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - aiohttp exposes no public getter
        return self.port

    async def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._clock is not None:
            self._clock.close()
            self._clock = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ---- interference ------------------------------------------------------------------------------------
    def set_interference(self, windows: list[InterferenceWindow], epoch_ns: int | None = None) -> None:
        """Declare capacity cuts; window times are trace seconds after `epoch_ns` (harness clock), divided by
        the service time scale. Overlapping windows multiply their capacities."""
        self._epoch_ns = now_ns() if epoch_ns is None else int(epoch_ns)
        self._windows = sorted(windows, key=lambda w: w.start_s)
        edges_s, factors = capacity_profile(self._windows)
        scale = self.service.time_scale
        edges = [self._epoch_ns + int(t * 1e9 / scale) for t in edges_s]
        self._set_profile(edges, factors)
        for timer in self._timers:
            timer.cancel()
        # Slots may reopen when a window ends: re-run admission at every edge.
        self._timers = [self._at(edge, self._admit) for edge in edges]

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
        """Run `callback()` at t_ns, never before; returns a handle with cancel()."""
        if self._clock is not None:
            future = self._clock.wait_until(t_ns)
            future.add_done_callback(lambda f: f.cancelled() or callback())
            return future
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, (t_ns - now_ns()) / 1e9), callback)

    async def _until(self, t_ns: int) -> None:
        """Sleep until t_ns on the harness clock, never waking before it."""
        if self._clock is not None:
            if t_ns > now_ns():
                await self._clock.wait_until(t_ns)
            return
        while (delay := (t_ns - now_ns()) / 1e9) > 0:
            await asyncio.sleep(delay)

    def _slots_at(self, t_ns: int) -> int:
        return max(1, int(self.service.batch_slots * self.capacity_at(t_ns)))

    def token_times_ns(self, start_ns: int, prompt_tokens: int, output_tokens: int) -> np.ndarray:
        """Real (harness-clock) completion time of each output token for a sequence admitted at start_ns."""
        svc = self.service
        work = prompt_tokens / svc.prefill_tokens_per_s + np.arange(output_tokens) / svc.decode_tokens_per_s
        later = self._edges_ns[self._edges_ns > start_ns]
        if not len(later):  # no window ahead: constant speed (the common case, kept cheap)
            speed = svc.time_scale * self.capacity_at(start_ns) / 1e9
            return (start_ns + work / speed).astype(np.int64)
        # Speed = model seconds per real ns: piecewise constant between window edges.
        starts = np.r_[start_ns, later].astype(np.float64)
        speed = svc.time_scale / 1e9 * np.asarray([self.capacity_at(int(t)) for t in starts])
        cum = np.r_[0.0, np.cumsum(np.diff(starts) * speed[:-1])]
        seg = np.searchsorted(cum, work, side="right") - 1
        return (starts[seg] + (work - cum[seg]) / speed[seg]).astype(np.int64)

    # ---- admission ---------------------------------------------------------------------------------------
    def _admit(self) -> None:
        slots = self._slots_at(now_ns())
        while self._waiting and self._running < slots:
            fut = self._waiting.popleft()
            if not fut.done():
                self._running += 1
                fut.set_result(None)
        self.stats.max_running = max(self.stats.max_running, self._running)

    async def _acquire(self) -> None:
        if not self._waiting and self._running < self._slots_at(now_ns()):
            self._running += 1
            self.stats.max_running = max(self.stats.max_running, self._running)
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        self.stats.max_waiting = max(self.stats.max_waiting, len(self._waiting))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()
            raise

    def _release(self) -> None:
        self._running -= 1
        self._admit()

    # ---- HTTP --------------------------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model",
                                                              "owned_by": "ocs-hil-emulator"}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _stats(self, request: web.Request) -> web.Response:
        s = self.stats
        return web.json_response({"received": s.received, "completed": s.completed, "rejected": s.rejected,
                                  "disconnected": s.disconnected, "running": self._running,
                                  "waiting": len(self._waiting), "max_running": s.max_running,
                                  "max_waiting": s.max_waiting})

    @staticmethod
    def _error(status: int, message: str, param: str | None = None) -> web.Response:
        # vLLM's ErrorResponse: OpenAI's {"error": {...}} envelope, `code` = the HTTP status.
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
        return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}},
                                 status=status)

    def _parse(self, body, chat: bool) -> tuple[int, int] | web.Response:
        """(prompt_tokens, max_tokens) of a valid request, else the error response."""
        if not isinstance(body, dict):
            return self._error(400, "request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model:
            return self._error(404, f"The model `{model}` does not exist.", "model")
        for key, ok in (("n", lambda v: v in (None, 1)), ("best_of", lambda v: v in (None, 1)),
                        ("logprobs", lambda v: v in (None, False)), ("top_logprobs", lambda v: v in (None, 0)),
                        ("prompt_logprobs", lambda v: v is None), ("echo", lambda v: v in (None, False))):
            if not ok(body.get(key)):
                return self._error(400, f"{key}={body[key]!r} is not supported by this endpoint", key)
        try:
            limit = body.get("max_completion_tokens") if chat else None
            max_tokens = int(body.get("max_tokens", 16) if limit is None else limit)
            prompt_tokens = _count_messages(body["messages"]) if chat else _count_prompt(body["prompt"])
        except KeyError as exc:
            return self._error(400, f"invalid request: missing {exc.args[0]!r}", exc.args[0])
        except (ValueError, TypeError) as exc:
            return self._error(400, f"invalid request: {exc}")
        if max_tokens < 1 or prompt_tokens + max_tokens > self.service.max_model_len:
            return self._error(400, f"This model's maximum context length is {self.service.max_model_len} "
                                    f"tokens; requested {prompt_tokens + max_tokens} (prompt {prompt_tokens}, "
                                    f"max_tokens {max_tokens})", "max_tokens")
        return prompt_tokens, max_tokens

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        t_received = now_ns()
        self.stats.received += 1
        try:
            body = orjson.loads(await request.read())  # bytes as they came: prompts of token ids are the cost
        except ValueError as exc:
            body = exc
        parsed = self._error(400, f"invalid JSON body: {body}") if isinstance(body, ValueError) \
            else self._parse(body, chat)
        if isinstance(parsed, web.Response):
            self.stats.rejected += 1
            return parsed
        prompt_tokens, max_tokens = parsed
        stream = bool(body.get("stream", False))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
        await self._acquire()
        t_admitted = now_ns()
        # The slot frees when the model says the sequence is done, not when a late writer gets the last
        # chunk out: a loaded machine delays the bytes, not the service model's capacity.
        held = [True]

        def release() -> None:
            if held[0]:
                held[0] = False
                self._release()
        timer = None
        try:
            times = self.token_times_ns(t_admitted, prompt_tokens, max_tokens)
            timer = self._at(int(times[-1]), release)
            ident = f"{'chatcmpl' if chat else 'cmpl'}-{self.stats.received}"
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                     "total_tokens": prompt_tokens + max_tokens}
            if stream:
                response = await self._stream(request, ident, times, usage if include_usage else None, chat)
            else:
                await self._until(int(times[-1]))
                text = TOKEN_TEXT * max_tokens
                choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                           "finish_reason": "length"} if chat else
                          {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"})
                response = web.json_response({
                    "id": ident, "object": "chat.completion" if chat else "text_completion",
                    "created": int(time.time()), "model": self.model, "choices": [choice], "usage": usage})
        except ConnectionResetError:  # the client left mid-answer (e.g. its own timeout): counted, not logged as
            self.stats.disconnected += 1  # a server error; aiohttp drops the reply to the closed connection
            return web.Response(status=499)
        except asyncio.CancelledError:
            self.stats.disconnected += 1
            raise
        finally:
            if timer is not None:
                timer.cancel()
            release()
        self.stats.completed += 1
        self.metrics.observe(self.service.time_scale, t_received, t_admitted, times, prompt_tokens)
        if self.keep_records:
            self.stats.records.append((t_received, t_admitted, int(times[0]), int(times[-1])))
        return response

    async def _stream(self, request: web.Request, ident: str, times: np.ndarray, usage: dict | None, chat: bool
                      ) -> web.StreamResponse:
        """One token per SSE chunk (as vLLM streams); tokens that are already due when the writer wakes leave
        in one network write, still one chunk each. `stream_interval_s` > 0 coalesces instead (the first and
        the last token still leave when due, so TTFT, TPOT and end-to-end latency stay exact)."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        head = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.model}
        tail = ', "usage": null}' if usage is not None else "}"
        prefix = f'data: {json.dumps(head)[:-1]}, "choices": [{{"index": 0, ' + \
            ('"delta": {"content": "' if chat else '"text": "')
        close = '"}' if chat else '"'

        def chunk(count: int, finish: str | None) -> bytes:  # TOKEN_TEXT needs no JSON escaping
            reason = "null" if finish is None else f'"{finish}"'
            return f'{prefix}{TOKEN_TEXT * count}{close}, "logprobs": null, "finish_reason": {reason}}}]{tail}\n\n'.encode()

        if chat:  # the first chunk carries the role, as OpenAI's and vLLM's do
            role = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]}
            await response.write(b"data: " + json.dumps(role).encode() + b"\n\n")
        interval_ns = int(self.service.stream_interval_s * 1e9)
        sent, last_write, n = 0, -interval_ns, len(times)
        one = chunk(1, None)
        due = times.tolist()  # Python ints: a wake per token reads them, numpy's scalars cost more per read
        last = due[-1]
        while sent < n:
            # Coalescing never holds back the last token: the completion time stays the model's.
            await self._until(max(due[sent], min(last_write + interval_ns, last)))
            now = now_ns()
            ready = max(bisect_right(due, now), sent + 1)
            if interval_ns:
                parts = [chunk(ready - sent, "length" if ready == n else None)]
            else:
                parts = [one] * (ready - sent - (ready == n)) + ([chunk(1, "length")] if ready == n else [])
            sent, last_write = ready, now
            if sent == n:  # the last chunk, usage, [DONE] and the chunked terminator leave in one write
                if usage is not None:
                    parts.append(b"data: " + json.dumps({**head, "choices": [], "usage": usage}).encode() + b"\n\n")
                parts.append(b"data: [DONE]\n\n")
                await response.write_eof(b"".join(parts))
            else:
                await response.write(b"".join(parts))
        return response


TOKEN_TEXT = " t"  # every emulated output token


def _count_prompt(prompt) -> int:
    """Tokens in a completions prompt: a list of token ids counts exactly; text counts one token per
    whitespace-separated word. Batches (lists of prompts) are refused."""
    # Checking the first element tells a token list from a batch without a per-token loop.
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
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
