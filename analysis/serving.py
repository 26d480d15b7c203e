"""The serving model: a token-level service (FIFO batch slots, prefill then decode at fixed rates, capacity
cut inside interference windows) and its exact discrete-event ground truth, plus the per-request latencies
and SLO violations every serving study reads. Pure: the emulated vLLM endpoint serves this model, and the
DiLoCo study evaluates policies with it."""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class ServiceModel:
    prefill_tokens_per_s: float = 20_000.0
    decode_tokens_per_s: float = 50.0
    batch_slots: int = 64
    max_model_len: int = 32_768
    time_scale: float = 1.0
    stream_interval_s: float = 0.0  # > 0: real s between SSE writes, tokens coalesced (first and last on time)

    def __post_init__(self):
        if min(self.prefill_tokens_per_s, self.decode_tokens_per_s, self.time_scale) <= 0 or self.batch_slots < 1:
            raise ValueError("service rates, time_scale and batch_slots must be positive")

    @classmethod
    def of_step(cls, p: dict) -> "ServiceModel":
        """The model a serving step's parameters describe (the emulated endpoint's)."""
        return cls(prefill_tokens_per_s=p["prefill_tokens_per_s"], decode_tokens_per_s=p["decode_tokens_per_s"],
                   batch_slots=p["batch_slots"], max_model_len=p["max_model_len"], time_scale=p["time_scale"],
                   stream_interval_s=p.get("stream_interval_s", 0.0))


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


def capacity_profile(windows) -> tuple[np.ndarray, np.ndarray]:
    """Window edges (trace s, sorted, distinct) and the capacity factor before, between and after them
    (len(edges) + 1 values; overlapping windows multiply)."""
    edges = sorted({t for w in windows for t in (w.start_s, w.start_s + w.duration_s)})
    factors = [1.0]
    for a, b in zip(edges[:-1], edges[1:]):
        mid = (a + b) / 2
        factors.append(math.prod(w.capacity for w in windows if w.start_s <= mid < w.start_s + w.duration_s))
    factors.append(1.0)
    return np.asarray(edges, dtype=float), np.asarray(factors if edges else [1.0])


def simulate_service(service: ServiceModel, arrival_s, prompt_tokens, output_tokens, windows=()) -> dict:
    """Ground truth of the service model for requests arriving at `arrival_s` (model seconds): what the
    emulator does, as a discrete-event simulation — FIFO admission to max(1, int(batch_slots·capacity))
    slots, re-checked at arrivals, completions and window edges; prefill then decode at the rates × the
    capacity in force (work integrated over the piecewise-constant speed). Returns arrays admitted_s,
    first_s, done_s (NaN where the emulator answers 400: empty prompt or prompt + output > max_model_len)."""
    import heapq
    from bisect import bisect_right

    arrival = np.asarray(arrival_s, dtype=float)
    prompts = np.asarray(prompt_tokens, dtype=np.int64)
    outputs = np.maximum(1, np.asarray(output_tokens, dtype=np.int64))
    n = len(arrival)
    edges_arr, factors_arr = capacity_profile(list(windows))
    # Scalar bisection on lists: this runs once per request, where numpy's per-call overhead dominates.
    edges, factors = edges_arr.tolist(), factors_arr.tolist()
    cum = np.r_[0.0, np.cumsum(np.diff(edges_arr) * factors_arr[1:-1])].tolist() if edges else []

    def work_at(t: float) -> float:  # ∫ speed from the first edge (or 0) to t
        if not edges:
            return t
        k = bisect_right(edges, t)
        return (t - edges[0]) * factors[0] if k == 0 else cum[k - 1] + (t - edges[k - 1]) * factors[k]

    def time_of(w: float) -> float:  # inverse of work_at
        if not edges:
            return w
        k = bisect_right(cum, w)
        return edges[0] + w / factors[0] if k == 0 else edges[k - 1] + (w - cum[k - 1]) / factors[k]

    def slots(t: float) -> int:
        return max(1, int(service.batch_slots * (factors[bisect_right(edges, t)] if edges else 1.0)))

    admitted, first, done = (np.full(n, np.nan) for _ in range(3))
    valid = ((prompts >= 1) & (prompts + outputs <= service.max_model_len)).tolist()
    prefill = (prompts / service.prefill_tokens_per_s).tolist()
    decode = ((outputs - 1) / service.decode_tokens_per_s).tolist()
    arrivals = arrival.tolist()
    finishing: list[tuple[float, int]] = []
    waiting: deque[int] = deque()
    running = 0

    def admit(i: int, t: float) -> None:
        nonlocal running
        running += 1
        w0 = work_at(t)
        end = time_of(w0 + prefill[i] + decode[i])
        admitted[i], first[i], done[i] = t, time_of(w0 + prefill[i]), end
        heapq.heappush(finishing, (end, i))

    def fill(t: float) -> None:
        while waiting and running < slots(t):
            admit(waiting.popleft(), t)

    edge_list, e, i = edges, 0, 0
    while i < n or finishing:
        t_arrival = arrivals[i] if i < n else math.inf
        t_done = finishing[0][0] if finishing else math.inf
        t_edge = edge_list[e] if e < len(edge_list) else math.inf
        if t_done <= t_arrival and t_done <= t_edge:
            heapq.heappop(finishing)
            running -= 1
            fill(t_done)
        elif t_edge <= t_arrival:
            e += 1
            fill(t_edge)
        else:
            if valid[i]:
                if not waiting and running < slots(t_arrival):
                    admit(i, t_arrival)
                else:
                    waiting.append(i)
            i += 1
    return {"admitted_s": admitted, "first_s": first, "done_s": done}


def peak_in_flight(start_s, end_s) -> int:
    """The most intervals [start, end) open at once (NaN ends: answered at once, never in flight)."""
    start = np.asarray(start_s, dtype=float)
    end = np.asarray(end_s, dtype=float)
    keep = np.isfinite(end) & (end > start)
    times = np.r_[start[keep], end[keep]]
    steps = np.r_[np.ones(keep.sum(), dtype=np.int64), -np.ones(keep.sum(), dtype=np.int64)]
    order = np.lexsort((steps, times))  # at a tie an end comes before a start
    return int(np.cumsum(steps[order]).max(initial=0))


def in_windows(times_s: np.ndarray, windows: pd.DataFrame | None) -> np.ndarray:
    """True where a time falls in some [start_s, start_s + duration_s)."""
    times_s = np.asarray(times_s, dtype=float)
    if windows is None or not len(windows):
        return np.zeros(len(times_s), dtype=bool)
    starts = windows["start_s"].to_numpy(dtype=float)
    ends = starts + windows["duration_s"].to_numpy(dtype=float)
    order = np.argsort(starts)
    starts, ends = starts[order], ends[order]
    # Windows do not overlap (validated / generated so): the candidate is the last one starting at or before t.
    k = np.searchsorted(starts, times_s, side="right") - 1
    return (k >= 0) & (times_s < ends[np.clip(k, 0, None)])


def request_latencies(records: pd.DataFrame, latency_scale: float = 1.0) -> pd.DataFrame:
    """Per request (sorted by index): ttft_ms, tpot_ms, e2e_ms in trace time (measured × latency_scale);
    NaN where undefined (failed requests; TPOT needs ≥ 2 output tokens)."""
    rec = records.sort_values("index")
    sent = rec["sent_ns"].to_numpy(dtype=float)
    first = rec["first_token_ns"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    done = rec["completed_ns"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    tokens = rec["output_tokens"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    ok = (rec["status"] == "ok").to_numpy()
    scale = latency_scale / 1e6
    ttft = np.where(ok, (first - sent) * scale, np.nan)
    e2e = np.where(ok, (done - sent) * scale, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(ok & (tokens >= 2), (done - first) * scale / (tokens - 1), np.nan)
    return pd.DataFrame({"index": rec["index"].to_numpy(), "status": rec["status"].to_numpy(),
                         "ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e})


def slo_violations(latencies: pd.DataFrame, slo_ttft_ms: float = 0.0, slo_tpot_ms: float = 0.0,
                   slo_e2e_ms: float = 0.0, slo_batch_ms: float = 0.0) -> np.ndarray:
    """A request violates the SLO if it did not finish ok or exceeds any configured bound (0 = unset);
    `slo_batch_ms` bounds the latency of the closed-loop batch the request was sent in (column batch_ms)."""
    bad = (latencies["status"] != "ok").to_numpy().copy()
    for column, bound in (("ttft_ms", slo_ttft_ms), ("tpot_ms", slo_tpot_ms), ("e2e_ms", slo_e2e_ms),
                          ("batch_ms", slo_batch_ms)):
        if bound > 0:
            bad |= latencies[column].to_numpy(dtype=float) > bound  # NaN (undefined) compares False
    return bad


@dataclass(frozen=True)
class BurstyClosedLoop:
    """The authors' artifact's own serving load (its `real_sidecar_validation.py`, `--load-profile bursty`, as its
    stage-12/13 runs set it): one closed-loop client sends a batch of `concurrency` prompts, waits until the whole
    batch is done, then sends the next. The concurrency is `busy_concurrency` while (t + burst_phase_s) mod
    burst_period_s < burst_window_s, else `quiet_concurrency`, read when a batch starts. Prompt lengths cycle
    through `prompt_tokens` (the artifact's "mixed" style: its base prompt repeated 1, 4, 12 and 24 times, a
    long preamble before the last two; token counts ours, approximate); every prompt decodes `output_tokens`
    (max_new_tokens at temperature 0). The sidecar's inference pressure is `busy_pressure` inside a burst and
    `quiet_pressure` outside (the artifact's sidecar reports 0.95 and 0.08 for this profile)."""

    quiet_concurrency: int = 4
    busy_concurrency: int = 12
    burst_period_s: float = 120.0
    burst_window_s: float = 30.0
    burst_phase_s: float = 0.0
    prompt_tokens: tuple[int, ...] = (14, 56, 248, 416)
    output_tokens: int = 128
    quiet_pressure: float = 0.08
    busy_pressure: float = 0.95

    def __post_init__(self):
        if min(self.quiet_concurrency, self.busy_concurrency, self.output_tokens) < 1 or not self.prompt_tokens \
                or min(self.prompt_tokens) < 1:
            raise ValueError("concurrencies, output_tokens and every prompt length must be ≥ 1")
        if not 0 <= self.burst_window_s <= self.burst_period_s or self.burst_period_s <= 0:
            raise ValueError("need 0 <= burst_window_s <= burst_period_s and burst_period_s > 0")
        if not (0 <= self.quiet_pressure <= 1 and 0 <= self.busy_pressure <= 1):
            raise ValueError("pressures must be in [0, 1]")

    def in_burst(self, t_s):
        return (np.asarray(t_s, dtype=float) + self.burst_phase_s) % self.burst_period_s < self.burst_window_s

    def pressure(self, cycle_s: float, duration_s: float, samples: int = 32) -> np.ndarray:
        """The sidecar's inference pressure per control cycle: quiet + (busy − quiet) × the cycle's share in a
        burst (at `samples` midpoints of the cycle, as the artifact's sidecar measures it)."""
        n = int(math.ceil(duration_s / cycle_s - 1e-9))
        t = (np.arange(n)[:, None] + (np.arange(samples)[None, :] + 0.5) / samples) * cycle_s
        share = self.in_burst(t).mean(axis=1)
        return self.quiet_pressure + (self.busy_pressure - self.quiet_pressure) * share


def closed_loop_batches(service: ServiceModel, load: BurstyClosedLoop, duration_s: float, windows=()
                        ) -> pd.DataFrame:
    """The closed loop under the service model: batches start at 0 and each at the previous batch's end, until
    `duration_s`; each batch's requests are served by `simulate_service` (the capacity cut inside `windows`).
    One row per request: batch, start_s, prompt_tokens, output_tokens, first_s, done_s and batch_ms (the batch's
    latency, which the artifact records for every request of it). A request the service refuses (prompt +
    output > max_model_len) would never end the batch: an error here."""
    windows = list(windows)
    rows, t, index, batch = [], 0.0, 0, 0
    cycle = len(load.prompt_tokens)
    while t < duration_s:
        c = load.busy_concurrency if load.in_burst(t) else load.quiet_concurrency
        prompts = np.asarray([load.prompt_tokens[(index + i) % cycle] for i in range(c)])
        outputs = np.full(c, load.output_tokens)
        sim = simulate_service(service, np.full(c, t), prompts, outputs, windows)
        if not np.all(np.isfinite(sim["done_s"])):
            raise ValueError(f"a prompt of {int(prompts.max())} + {load.output_tokens} tokens exceeds max_model_len "
                             f"{service.max_model_len}")
        end = float(sim["done_s"].max())
        rows.append(pd.DataFrame({"batch": batch, "start_s": t, "prompt_tokens": prompts, "output_tokens": outputs,
                                  "first_s": sim["first_s"], "done_s": sim["done_s"], "batch_ms": (end - t) * 1e3}))
        t, index, batch = end, index + c, batch + 1
    return pd.concat(rows, ignore_index=True)
