"""The `replay` step: replay an inference trace in real time against a serving endpoint during a run, and
measure SLO violations inside and outside interference windows (e.g. DiLoCo sync windows).

- Trace: a file (any format `traces.load_requests` reads; relative to the playbook's folder) or a seeded
  generated one (`generate:poisson`, `generate:mmpp`; the seed comes from the run's seed and the step name).
- Endpoint: `emulated` starts a `VllmEmulator` on 127.0.0.1 for the step (service model from the step's
  knobs, time-scaled like the replay); or an `http://` URL, which must be loopback unless the run is on a
  real bench.
- Interference: windows (generated DiLoCo sync windows, or a sync-window file) cut the emulated endpoint's
  capacity; the same windows split the SLO metrics by arrival time (inside vs outside), the WA-DiLoCo
  "sync-excess" view (spec/algorithms.md §7.2).

Latencies are reported in trace time: with the emulated endpoint the service is time-scaled with the replay,
so measured latencies are multiplied back by `time_scale`; a real endpoint is not scaled (factor 1).
Failed and timed-out requests are data (they count as SLO violations); the step fails only if a request
has no record in the durable log.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.serving import in_windows, request_latencies, slo_violations
from harness.bench.serving import check_endpoint, run_replay
from harness.config import register_step
from harness.errors import InputError
from harness.outcome import Check, StepResult
from harness.specs import AfterValidator, Annotated, AtLeastOne, Count, Field, Fraction, Positive, Seconds, Spec

GENERATORS = ("generate:poisson", "generate:mmpp")


def _generator_known(known: tuple[str, ...]) -> AfterValidator:
    """A `generate:KIND` value names one of `known`; any other value is a file, looked for when the step runs."""
    def check(value: str) -> str:
        if value.startswith("generate:") and value not in known:
            raise ValueError(f"unknown generator {value!r} (known: {', '.join(known)})")
        return value

    return AfterValidator(check)


class ReplayParams(Spec):
    """Replay an inference trace in real time against a serving endpoint, SLO violations split by
    interference windows."""

    requests: Annotated[str, _generator_known(GENERATORS)] = Field(
        "generate:mmpp", description="a trace file, or generate:poisson | generate:mmpp")
    rate: Positive = Field(2.0, description="generated: requests/s of trace time (mmpp: the calm rate)")
    burst_factor: Positive = Field(5.0, description="mmpp: burst rate = burst_factor × rate")
    mean_burst_s: Positive = 5.0
    mean_gap_s: Positive = 30.0
    duration_s: Positive = Field(60.0, description="generated trace length (trace seconds)")
    prompt_median: Positive = Field(1020.0, description="generated token counts: lognormal around these medians")
    output_median: Positive = 129.0
    limit: Count = Field(0, description="the first N requests only; 0: all")
    time_scale: Positive = Field(1.0, description="> 1 replays faster than the trace (and speeds the emulated "
                                                  "service alike)")
    endpoint: str = Field("emulated", description="or http://127.0.0.1:PORT (other hosts only on a real bench)")
    model: str = "emulated-llm"
    prefill_tokens_per_s: Positive = Field(20_000.0, description="emulated service model (model seconds)")
    decode_tokens_per_s: Positive = 50.0
    batch_slots: AtLeastOne = 64
    max_model_len: AtLeastOne = 32_768
    interference: Annotated[str, _generator_known(("generate:diloco",))] = Field(
        "none", description="none | generate:diloco | a sync-window file (CSV or Parquet)")
    interference_capacity: Fraction = Field(0.5, description="fraction of rates and slots left inside a window")
    sync_count: AtLeastOne = Field(3, description="generate:diloco")
    sync_window_s: Positive = 8.0
    sync_min_gap_s: Seconds = 18.0
    slo_ttft_ms: Seconds = Field(0.0, description="0: not part of the SLO")
    slo_tpot_ms: Seconds = 0.0
    slo_e2e_ms: Seconds = 0.0
    timeout_s: Positive = Field(60.0, description="per request, wall seconds")
    max_connections: AtLeastOne = 256
    lead_s: Seconds = Field(0.5, description="wall time between start-up and the first request")


# ---- pure summary ------------------------------------------------------------------------------------------
def _pct(values: np.ndarray, q: float) -> float | None:
    values = values[np.isfinite(values)]
    return float(np.percentile(values, q)) if len(values) else None


def summarise(records: pd.DataFrame, arrival_s: np.ndarray, windows: pd.DataFrame | None, *,
              slo_ttft_ms: float = 0.0, slo_tpot_ms: float = 0.0, slo_e2e_ms: float = 0.0,
              latency_scale: float = 1.0) -> dict:
    """The step's summary from the replay records (one per request, `index` into `arrival_s`)."""
    from scipy.stats import fisher_exact

    n = len(arrival_s)
    lat = request_latencies(records, latency_scale)
    status = lat["status"].to_numpy()
    ordered = records.sort_values("index")
    send_error_us = ordered["send_error_ns"].to_numpy(dtype=float) / 1e3
    wait = ordered["connection_wait_ns"] if "connection_wait_ns" in ordered else pd.Series(np.nan, ordered.index)
    wait_us = pd.to_numeric(wait, errors="coerce").to_numpy(dtype=float, na_value=np.nan) / 1e3  # NaN: older logs
    summary: dict = {
        "n": n, "recorded": int(len(records)), "ok": int((status == "ok").sum()),
        "failed": int(np.isin(status, ("http_error", "error")).sum()), "timeout": int((status == "timeout").sum()),
        "send_error_us": {"p50": _pct(send_error_us, 50), "p99": _pct(send_error_us, 99)},  # on the wire
        "connection_wait_us": {"p50": _pct(wait_us, 50), "p99": _pct(wait_us, 99),  # its share: pool / connect
                               "waited": int(np.sum(wait_us > 0))},
        "latency_scale": latency_scale,
    }
    for column in ("ttft_ms", "tpot_ms", "e2e_ms"):
        values = lat[column].to_numpy(dtype=float)
        summary[column] = {"p50": _pct(values, 50), "p99": _pct(values, 99)}
    summary["aiperf"] = aiperf_terms(ordered, lat, latency_scale)
    slo = {"ttft_ms": slo_ttft_ms or None, "tpot_ms": slo_tpot_ms or None, "e2e_ms": slo_e2e_ms or None}
    summary["slo"] = slo
    inside = in_windows(np.asarray(arrival_s, dtype=float)[lat["index"].to_numpy()], windows)
    summary["windows"] = {"count": 0 if windows is None else int(len(windows)),
                          "requests_inside": int(inside.sum()), "requests_outside": int((~inside).sum())}
    if not any(slo.values()):
        summary["violation_rate"] = None
        return summary
    bad = slo_violations(lat, slo_ttft_ms, slo_tpot_ms, slo_e2e_ms)
    rate = lambda mask: float(bad[mask].mean()) if mask.any() else None  # noqa: E731
    v_in, v_out = rate(inside), rate(~inside)
    summary["violations"] = int(bad.sum())
    summary["violation_rate"] = rate(np.ones_like(bad))
    summary["violation_rate_inside"] = v_in
    summary["violation_rate_outside"] = v_out
    summary["sync_excess"] = None if v_in is None or v_out is None else v_in - v_out
    if v_in is not None and v_out is not None:
        table = [[int(bad[inside].sum()), int((~bad[inside]).sum())],
                 [int(bad[~inside].sum()), int((~bad[~inside]).sum())]]
        summary["inside_greater_p"] = float(fisher_exact(table, alternative="greater").pvalue)
    else:
        summary["inside_greater_p"] = None
    return summary


def aiperf_terms(records: pd.DataFrame, lat: pd.DataFrame, latency_scale: float) -> dict:
    """The replay in NVIDIA aiperf's metric names and definitions (its `metrics/types`): inter_token_latency
    = (request_latency − TTFT) / (output_sequence_length − 1), the same quantity as vLLM's TPOT here;
    benchmark_duration = first request sent to last response received; request_throughput = successful
    requests / benchmark_duration; output_token_throughput = their output tokens / benchmark_duration.
    Times in trace time (× latency_scale), as the step's other latencies."""
    ok = (records["status"] == "ok").to_numpy()
    itl = lat["tpot_ms"].to_numpy(dtype=float)
    duration_s = None
    if ok.any():
        done = records["completed_ns"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)[ok]
        duration_s = (np.nanmax(done) - records["sent_ns"].to_numpy(dtype=float).min()) / 1e9 * latency_scale
    tokens = float(records["output_tokens"].astype("Float64").to_numpy(dtype=float, na_value=0.0)[ok].sum())
    rate = lambda x: None if not duration_s else x / duration_s  # noqa: E731
    return {"time_to_first_token_ms": {"p50": _pct(lat["ttft_ms"].to_numpy(dtype=float), 50),
                                       "p99": _pct(lat["ttft_ms"].to_numpy(dtype=float), 99)},
            "inter_token_latency_ms": {"p50": _pct(itl, 50), "p99": _pct(itl, 99)},
            "benchmark_duration_s": duration_s, "request_throughput_per_s": rate(int(ok.sum())),
            "output_token_throughput_per_s": rate(tokens)}


def summary_markdown(name: str, s: dict, source: str, endpoint: str) -> str:
    f = lambda v, d=1: "—" if v is None else f"{v:.{d}f}"  # noqa: E731
    pct = lambda v: "—" if v is None else f"{100 * v:.1f} %"  # noqa: E731
    slo = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in s["slo"].items() if v) or "none"
    lines = [f"## Serving replay `{name}`", "",
             f"Trace {source} → {endpoint}: {s['n']} requests, {s['ok']} ok, {s['failed']} failed, "
             f"{s['timeout']} timed out; {s['recorded']} recorded. Latencies in trace time "
             f"(measured × {s['latency_scale']:g}); SLO: {slo}.", "",
             "| metric | p50 | p99 |", "|---|---:|---:|",
             f"| send error on the wire (µs, wall) | {f(s['send_error_us']['p50'])} | {f(s['send_error_us']['p99'])} |",
             f"| of which connection wait (µs, wall) | {f(s['connection_wait_us']['p50'])} | "
             f"{f(s['connection_wait_us']['p99'])} |",
             f"| TTFT (ms) | {f(s['ttft_ms']['p50'])} | {f(s['ttft_ms']['p99'])} |",
             f"| TPOT = aiperf's inter-token latency (ms) | {f(s['tpot_ms']['p50'], 2)} | {f(s['tpot_ms']['p99'], 2)} |",
             f"| completion (ms) | {f(s['e2e_ms']['p50'])} | {f(s['e2e_ms']['p99'])} |", ""]
    if s.get("aiperf"):
        a = s["aiperf"]
        lines += [f"In aiperf's terms (trace time): request throughput {f(a['request_throughput_per_s'], 2)} requests/s, "
                  f"output token throughput {f(a['output_token_throughput_per_s'])} tokens/s over a benchmark "
                  f"duration of {f(a['benchmark_duration_s'], 2)} s.", ""]
    if s["connection_wait_us"]["waited"]:
        lines += [f"{s['connection_wait_us']['waited']} requests waited for a client connection (pool full or a new "
                  "connection's set-up) before going on the wire: that wait is part of their send error, not of "
                  "their latency" + (f"; {s['connection_limit_reached']} found the pool full (raise max_connections)"
                                     if s.get("connection_limit_reached") else "") + ".", ""]
    if s.get("violation_rate") is not None:
        w = s["windows"]
        excess = "—" if s["sync_excess"] is None else f"{100 * s['sync_excess']:+.1f} pp"
        p_value = "—" if s["inside_greater_p"] is None else f"{s['inside_greater_p']:.3g}"
        lines += ["| SLO violations | all | inside windows | outside | sync-excess (in − out) | p (in > out) |",
                  "|---|---:|---:|---:|---:|---:|",
                  f"| {s['violations']} of {s['n']} | {pct(s['violation_rate'])} | "
                  f"{pct(s['violation_rate_inside'])} (n={w['requests_inside']}) | "
                  f"{pct(s['violation_rate_outside'])} (n={w['requests_outside']}) | {excess} | {p_value} |", ""]
    return "\n".join(lines)


# ---- parameters ----------------------------------------------------------------------------------------------
def _bad(step, message: str) -> InputError:
    return InputError(f"step {step.name}: {message}", step.file, step.line)


def stream_seed(ctx, step, purpose: str) -> int:
    """A generator seed from the run's seed, the step name and the purpose (reproducible on resume)."""
    return int(ctx.rng(f"replay-{purpose}:{step.name}").integers(2**62))


def load_trace(ctx, step, p: dict) -> tuple[pd.DataFrame, str]:
    """The requests to replay (canonical frame, index 0..n-1) and a short description of their source."""
    import traces

    source = p["requests"]
    seed = stream_seed(ctx, step, "trace")
    common = {"seed": seed, "duration_s": p["duration_s"], "prompt_median": p["prompt_median"],
              "output_median": p["output_median"]}
    if source == "generate:poisson":
        frame = traces.poisson_arrivals(rate=p["rate"], **common)
        label = f"Poisson {p['rate']:g}/s × {p['duration_s']:g} s"
    elif source == "generate:mmpp":
        frame = traces.mmpp_arrivals(base_rate=p["rate"], burst_rate=p["rate"] * p["burst_factor"],
                                     mean_burst_s=p["mean_burst_s"], mean_gap_s=p["mean_gap_s"], **common).requests
        label = f"MMPP {p['rate']:g}/s, bursts ×{p['burst_factor']:g}, {p['duration_s']:g} s"
    else:
        path = step.resolve_path(source)
        if not path.is_file():
            raise _bad(step, f"requests: no such trace file {str(path)!r}")
        frame = traces.load_requests(path)  # TraceFormatError names the trace file and line
        label = path.name
    if p["limit"]:
        frame = frame.iloc[: p["limit"]]
    if not len(frame):
        raise _bad(step, f"requests: the trace ({label}) has no requests to replay")
    return frame.reset_index(drop=True), label


def load_windows(ctx, step, p: dict, trace_end_s: float, emulated_endpoint: bool) -> pd.DataFrame | None:
    import traces

    choice = p["interference"]
    if choice == "none":
        return None
    if choice == "generate:diloco":
        if not emulated_endpoint:
            raise _bad(step, "interference: generated windows can only be applied to the emulated endpoint "
                             "(give a sync-window file to split the metrics of a real endpoint)")
        seed = stream_seed(ctx, step, "sync")
        try:
            return traces.diloco_sync_windows(seed=seed, count=p["sync_count"], duration_s=trace_end_s,
                                              window_s=p["sync_window_s"], min_gap_s=p["sync_min_gap_s"])
        except ValueError as exc:
            raise _bad(step, f"interference: {exc} (the trace spans {trace_end_s:g} s)") from None
    path = step.resolve_path(choice)
    if not path.is_file():
        raise _bad(step, f"interference: no such sync-window file {str(path)!r}")
    return traces.load_sync_windows(path)


# ---- the step --------------------------------------------------------------------------------------------
@register_step("replay", ReplayParams)
def replay_step(ctx, step) -> StepResult:
    import json

    from harness import record as rec
    from traces.replay import replay_log_to_parquet
    from traces.schema import write_requests, write_sync_windows

    p = dict(step.params)
    url = check_endpoint(step, p["endpoint"], real_bench=ctx.bench.truth is None)
    requests, label = load_trace(ctx, step, p)
    arrival_s = requests["arrival_s"].to_numpy(dtype=float)
    trace_end = float(p["duration_s"]) if p["requests"] in GENERATORS else float(arrival_s[-1])
    windows = load_windows(ctx, step, p, max(trace_end, float(arrival_s[-1])), url is None)
    slo = {k: p[k] for k in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms")}
    endpoint_label = "emulated vLLM endpoint" if url is None else url
    if ctx.dry_run:
        return StepResult(ok=True, summary_md=f"(dry run: would replay {len(requests)} requests of {label})")

    base = ctx.run_dir / f"replay_{step.name}"
    log_path, parquet_path, summary_path = (base.with_suffix(s) for s in (".jsonl", ".parquet", ".json"))
    if summary_path.exists():  # a resumed run: this replay already finished
        summary = json.loads(summary_path.read_text())["summary"]
        return _result(step, summary, label, endpoint_label)
    if log_path.exists():  # an interrupted replay: keep its records aside, replay from the start
        log_path.replace(base.with_name(base.name + ".incomplete.jsonl"))
    if p["requests"] in GENERATORS:
        write_requests(requests, base.with_name(base.name + "_requests.parquet"))
    if windows is not None:
        write_sync_windows(windows, base.with_name(base.name + "_windows.parquet"))

    span_s = (arrival_s[-1] - arrival_s[0]) / p["time_scale"]
    interference = "" if windows is None else (
        f", {len(windows)} interference windows at capacity {p['interference_capacity']:g}" if url is None
        else f", {len(windows)} declared sync windows (metrics split only)")
    ctx.say(f"  replaying {len(requests)} requests ({label}) over {span_s:.1f} s at ×{p['time_scale']:g} → "
            f"{endpoint_label}{interference}")
    replayed = run_replay(requests, url, p, windows, log_path)
    records = replay_log_to_parquet(log_path, parquet_path)  # the durable log is the source of truth
    latency_scale = p["time_scale"] if url is None else 1.0
    applied = url is None and windows is not None
    summary = summarise(records, arrival_s, windows, latency_scale=latency_scale, **slo)
    summary.update({"source": label, "endpoint": endpoint_label, "time_scale": p["time_scale"],
                    "interference": p["interference"],
                    "interference_applied": applied,  # False: windows only split the metrics
                    "interference_capacity": p["interference_capacity"] if applied else None,
                    "log": log_path.name, "parquet": parquet_path.name,
                    "replay_wall_s": replayed.duration_s, "max_in_flight": replayed.max_in_flight,
                    # sent while every connection was busy: their real send (and latency start) was later
                    "connection_limit_reached": replayed.connection_limit_reached,
                    "trace_seed": stream_seed(ctx, step, "trace") if p["requests"] in GENERATORS else None,
                    "sync_seed": stream_seed(ctx, step, "sync") if p["interference"] == "generate:diloco" else None})
    rec.write_json_atomic(summary_path, {"step": step.name, "summary": summary,
                                         "windows": None if windows is None else windows.to_dict(orient="list")})
    return _result(step, summary, label, endpoint_label, records)


def _result(step, summary: dict, label: str, endpoint: str, records: pd.DataFrame | None = None) -> StepResult:
    n = summary["n"]
    if records is not None:
        indices = records["index"].to_numpy()
        complete = len(records) == n and np.array_equal(np.sort(indices), np.arange(n))
    else:
        complete = summary["recorded"] == n
    # Failed and timed-out requests are data (SLO violations), not a step failure: only a lost record is.
    checks = [Check(name="every request has a record", ok=bool(complete),
                    detail=f"{summary['recorded']} records for {n} requests ({summary['ok']} ok, "
                           f"{summary['failed']} failed, {summary['timeout']} timed out)")]
    return StepResult(ok=bool(complete), summary=summary, checks=checks,
                      summary_md=summary_markdown(step.name, summary, label, endpoint),
                      artifacts=[summary["log"], summary["parquet"], f"replay_{step.name}.json"])
