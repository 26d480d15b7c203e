"""Emulated vLLM-compatible endpoint (aiohttp, 127.0.0.1 only): `POST /v1/completions` (streaming SSE or
not), `GET /v1/models`, `GET /health`, `GET /stats`.

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
import json
import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from aiohttp import web

from devices.timing import now_ns

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ServiceModel:
    prefill_tokens_per_s: float = 20_000.0
    decode_tokens_per_s: float = 50.0
    batch_slots: int = 64
    max_model_len: int = 32_768
    time_scale: float = 1.0
    stream_interval_s: float = 0.02  # real seconds between SSE chunks of one request (tokens are coalesced)

    def __post_init__(self):
        if min(self.prefill_tokens_per_s, self.decode_tokens_per_s, self.time_scale) <= 0 or self.batch_slots < 1:
            raise ValueError("service rates, time_scale and batch_slots must be positive")


@dataclass(frozen=True)
class InterferenceWindow:
    """[start_s, start_s + duration_s) in trace seconds after the epoch; capacity in (0, 1]."""

    start_s: float
    duration_s: float
    capacity: float = 0.5

    def __post_init__(self):
        if not 0 < self.capacity <= 1 or self.duration_s <= 0:
            raise ValueError("interference window needs duration > 0 and capacity in (0, 1]")

    @classmethod
    def from_frame(cls, frame, capacity: float) -> list["InterferenceWindow"]:
        """Windows from any table with `start_s` and `duration_s` columns (e.g. DiLoCo sync windows)."""
        return [cls(float(a), float(d), capacity) for a, d in zip(frame["start_s"], frame["duration_s"])]


@dataclass
class _Stats:
    received: int = 0
    completed: int = 0
    rejected: int = 0
    disconnected: int = 0
    max_running: int = 0
    max_waiting: int = 0
    records: list = field(default_factory=list)  # (t_received_ns, t_admitted_ns, t_first_ns, t_done_ns)


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
        self._epoch_ns = now_ns()
        self._windows: list[InterferenceWindow] = []
        self._edges_ns = np.empty(0, dtype=np.int64)  # window edges (real ns), sorted
        self._edge_factor = np.ones(1)  # capacity factor in each interval between edges
        self._running = 0
        self._waiting: deque[asyncio.Future] = deque()
        self._runner: web.AppRunner | None = None
        self._timers: list[asyncio.TimerHandle] = []

    # ---- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> int:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
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

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ---- interference ------------------------------------------------------------------------------------
    def set_interference(self, windows: list[InterferenceWindow], epoch_ns: int | None = None) -> None:
        """Declare capacity cuts; window times are trace seconds after `epoch_ns` (harness clock), divided by
        the service time scale. Overlapping windows multiply their capacities."""
        self._epoch_ns = now_ns() if epoch_ns is None else int(epoch_ns)
        self._windows = sorted(windows, key=lambda w: w.start_s)
        scale = self.service.time_scale
        edges = sorted({self._epoch_ns + int(t * 1e9 / scale)
                        for w in self._windows for t in (w.start_s, w.start_s + w.duration_s)})
        self._edges_ns = np.asarray(edges, dtype=np.int64)
        mids = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
        factors = [1.0]
        for mid in mids:
            t = (mid - self._epoch_ns) * scale / 1e9
            factors.append(math.prod(w.capacity for w in self._windows if w.start_s <= t < w.start_s + w.duration_s))
        factors.append(1.0)
        self._edge_factor = np.asarray(factors[: len(edges) + 1] if edges else [1.0])
        loop = asyncio.get_running_loop()
        for timer in self._timers:
            timer.cancel()
        # Slots may reopen when a window ends: re-run admission at every edge.
        offset = loop.time() - now_ns() / 1e9
        self._timers = [loop.call_at(edge / 1e9 + offset, self._admit) for edge in edges]

    def capacity_at(self, t_ns: int) -> float:
        return float(self._edge_factor[np.searchsorted(self._edges_ns, t_ns, side="right")])

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

    async def _stats(self, request: web.Request) -> web.Response:
        s = self.stats
        return web.json_response({"received": s.received, "completed": s.completed, "rejected": s.rejected,
                                  "disconnected": s.disconnected, "running": self._running,
                                  "waiting": len(self._waiting), "max_running": s.max_running,
                                  "max_waiting": s.max_waiting})

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response({"object": "error", "message": message, "type": "BadRequestError",
                                  "code": status}, status=status)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        t_received = now_ns()
        self.stats.received += 1
        try:
            body = await request.json(loads=json.loads)
            prompt = body["prompt"]
            max_tokens = int(body.get("max_tokens", 16))
        except (ValueError, KeyError, TypeError) as exc:
            self.stats.rejected += 1
            return self._error(400, f"invalid request: {exc}")
        # A batch is a list of lists or strings: checking the first element tells them apart without a
        # per-token loop (which cost more than the rest of the request).
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            prompt_tokens = len(prompt)
        elif isinstance(prompt, str):
            prompt_tokens = len(prompt.split())
        else:
            self.stats.rejected += 1
            return self._error(400, "prompt must be a string or a list of token ids (batches unsupported)")
        if max_tokens < 1 or prompt_tokens + max_tokens > self.service.max_model_len:
            self.stats.rejected += 1
            return self._error(400, f"This model's maximum context length is {self.service.max_model_len} "
                                    f"tokens; requested {prompt_tokens + max_tokens} (prompt {prompt_tokens}, "
                                    f"max_tokens {max_tokens})")
        stream = bool(body.get("stream", False))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
        await self._acquire()
        t_admitted = now_ns()
        try:
            times = self.token_times_ns(t_admitted, prompt_tokens, max_tokens)
            ident = f"cmpl-{self.stats.received}"
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                     "total_tokens": prompt_tokens + max_tokens}
            if stream:
                response = await self._stream(request, ident, times, usage if include_usage else None)
            else:
                await _sleep_until(int(times[-1]))
                response = web.json_response({
                    "id": ident, "object": "text_completion", "created": int(time.time()), "model": self.model,
                    "choices": [{"index": 0, "text": " t" * max_tokens, "logprobs": None,
                                 "finish_reason": "length"}], "usage": usage})
        except (ConnectionResetError, asyncio.CancelledError):
            self.stats.disconnected += 1
            raise
        finally:
            self._release()
        self.stats.completed += 1
        if self.keep_records:
            self.stats.records.append((t_received, t_admitted, int(times[0]), int(times[-1])))
        return response

    async def _stream(self, request: web.Request, ident: str, times: np.ndarray, usage: dict | None
                      ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        created = int(time.time())
        interval_ns = int(self.service.stream_interval_s * 1e9)
        sent, last_write, n = 0, -interval_ns, len(times)
        while sent < n:
            await _sleep_until(max(int(times[sent]), last_write + interval_ns))
            now = now_ns()
            ready = int(np.searchsorted(times, now, side="right"))
            count = max(ready, sent + 1) - sent
            finish = "length" if sent + count == n else None
            chunk = {"id": ident, "object": "text_completion", "created": created, "model": self.model,
                     "choices": [{"index": 0, "text": " t" * count, "logprobs": None, "finish_reason": finish}]}
            if usage is not None:
                chunk["usage"] = None
            payload = b"data: " + json.dumps(chunk).encode() + b"\n\n"
            sent += count
            last_write = now
            if sent == n:  # the last chunk, usage and [DONE] leave in one write
                if usage is not None:
                    final = {"id": ident, "object": "text_completion", "created": created, "model": self.model,
                             "choices": [], "usage": usage}
                    payload += b"data: " + json.dumps(final).encode() + b"\n\n"
                payload += b"data: [DONE]\n\n"
            await response.write(payload)
        await response.write_eof()
        return response


async def _sleep_until(t_ns: int) -> None:
    delay = (t_ns - now_ns()) / 1e9
    if delay > 0:
        await asyncio.sleep(delay)


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
        print(f"listening {LOOPBACK}:{port}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await emulator.stop()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
