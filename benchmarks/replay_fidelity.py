"""Replay fidelity: the Azure 2023 conversation trace, time-scaled to each named rate, against the emulated vLLM
endpoint in its own process (a fresh one per run), replayed by `traces.replay` and, beside it, by the naive
script a lab would write. Prints, per rate and replayer: the connections warmed before the origin and the most
requests in flight at once (sent, answer not yet read: more than the service model's peak when the endpoint
runs late), send-time error p50/p99 (on the wire − scheduled, on the monotonic clock), the part of it spent
waiting for a client connection, CPU per request of the client
and of the server, and the share of the replay's wall time its loop was runnable without a CPU (other load on
the machine: wall-clock figures taken with it well above 0 are the machine's, not the replay's). Goals: p99
<= 1 ms at 1 000 req/s and <= 5 ms at 5 000 req/s.

The naive replay: one loop that `asyncio.sleep`s until each request is due and starts it as a task, aiohttp's
default session (a pool of 100, nothing opened ahead), the stream read line by line with `json.loads`; the
same request bodies, and its send time stamped on the wire the same way.

    .venv/bin/python benchmarks/replay_fidelity.py [--rates 100,1000,5000] [--seconds 4] [--runs 1]
        [--no-naive] [--in-process] [--warm N] [--cprofile FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# Scripts run with benchmarks/ on sys.path; put the repo root first so the project's packages win.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import traces  # noqa: E402
from traces.replay import ReplayConfig, replay_requests, run_loop, warm_pool_size  # noqa: E402

SHARED = Path(os.environ.get("OCS_HIL_SHARED") or Path(__file__).resolve().parents[1].parent / "shared")
TRACE = SHARED / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"


def start_server(scale: float, stream_interval_s: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "devices.emulated.vllm_server", "--port", "0",
                             "--time-scale", str(scale), "--stream-interval-s", str(stream_interval_s)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    line = proc.stdout.readline().strip()
    if not line.startswith("listening "):
        proc.kill()
        raise SystemExit(f"emulator did not start: {line!r}")
    return proc, "http://" + line.split()[1]


def harness_config(url: str, scale: float, requests, warm: int | None = None) -> ReplayConfig:
    """The replay step's configuration, its warm pool sized here (outside the measured CPU) unless `warm` is given."""
    from analysis.serving import ServiceModel

    if warm is None:
        warm = warm_pool_size(requests, ServiceModel(time_scale=scale), 256)
    return ReplayConfig(url=url, time_scale=scale, max_connections=256, warm_connections=warm)


def wire_trace_config():
    """aiohttp tracing for the naive replay, stamping its record (`trace_request_ctx`) as the harness's client
    does: `sent_ns` when the body is written to the socket, `connection_wait_ns` += time queued for a pooled
    connection or opening one."""
    import aiohttp

    from devices.timing import now_ns

    config = aiohttp.TraceConfig()

    async def on_chunk_sent(session, ctx, params) -> None:
        if ctx.trace_request_ctx["sent_ns"] is None:
            ctx.trace_request_ctx["sent_ns"] = now_ns()

    async def wait_start(session, ctx, params) -> None:
        ctx.wait_from = now_ns()

    async def wait_end(session, ctx, params) -> None:
        ctx.trace_request_ctx["connection_wait_ns"] += now_ns() - ctx.wait_from

    config.on_request_chunk_sent.append(on_chunk_sent)
    for start, end in ((config.on_connection_queued_start, config.on_connection_queued_end),
                       (config.on_connection_create_start, config.on_connection_create_end)):
        start.append(wait_start)
        end.append(wait_end)
    return config


async def naive_replay(requests, url: str, scale: float, prompts, origin_ns: int) -> list[dict]:
    """What a lab script does: sleep until due, start a task, read the stream line by line."""
    import aiohttp

    from devices.timing import now_ns

    arrival = requests["arrival_s"].to_numpy(dtype=float)
    arrival = (arrival - arrival[0]) / scale
    outputs = requests["output_tokens"].to_numpy()
    records: list[dict] = []

    async def one(session, i: int) -> None:
        record = {"scheduled_ns": origin_ns + int(arrival[i] * 1e9), "sent_ns": None, "connection_wait_ns": 0}
        body = (b'{"model":"emulated-llm","prompt":' + prompts.json_ids(i) +
                f',"max_tokens":{max(1, int(outputs[i]))},"ignore_eos":true,"stream":true}}'.encode())
        handed = now_ns()
        try:
            async with session.post(url + "/v1/completions", data=body, trace_request_ctx=record,
                                    headers={"Content-Type": "application/json"}) as resp:
                async for line in resp.content:
                    if line.startswith(b"data:") and line.strip() != b"data: [DONE]":
                        json.loads(line[5:])
            record["ok"] = True
        except (aiohttp.ClientError, OSError) as exc:
            record["ok"], record["error"] = False, repr(exc)
        record["sent_ns"] = record["sent_ns"] or handed
        records.append(record)

    async with aiohttp.ClientSession(trace_configs=[wire_trace_config()]) as session:
        loop = asyncio.get_running_loop()
        start = loop.time() + (origin_ns - now_ns()) / 1e9
        tasks = []
        for i in range(len(arrival)):
            delay = start + arrival[i] - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, i)))
        await asyncio.gather(*tasks)
    return records


def percentiles(values_ns) -> tuple[float, float]:
    values = np.asarray(values_ns, dtype=float) / 1e3
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


async def measure(kind: str, requests, scale: float, url: str, server_pid: int | None, cprofile,
                  warm: int | None = None) -> dict:
    from analysis.serving import peak_in_flight
    from devices.timing import cpu_wait_s, now_ns
    from scale import live_cpu_s
    from traces.replay import prepared_prompts

    prompts = prepared_prompts(requests, ReplayConfig(url=url))
    config = harness_config(url, scale, requests, warm) if kind == "harness" else None  # the pool's sizing: not per request
    cpu0, wait0, wall0 = time.process_time(), cpu_wait_s(), time.monotonic()
    server_cpu0 = live_cpu_s(server_pid) if server_pid else None
    if cprofile is not None:
        cprofile.enable()
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "harness":
            summary = await replay_requests(requests, config, Path(tmp) / "replay.jsonl", prompts)
            rec = summary.records
            errors, waits = rec["send_error_ns"].to_numpy(), rec["connection_wait_ns"].to_numpy()
            ok, warm = int((rec["status"] == "ok").sum()), config.warm_connections
            peak = peak_in_flight(rec["sent_ns"].to_numpy(dtype=float), rec["completed_ns"].to_numpy(dtype=float))
        else:
            origin = now_ns() + int(0.2e9)
            rows = await naive_replay(requests, url, scale, prompts, origin)
            errors = [r["sent_ns"] - r["scheduled_ns"] for r in rows]
            waits = [r["connection_wait_ns"] for r in rows]
            ok, warm, peak = sum(r["ok"] for r in rows), 0, None
    if cprofile is not None:
        cprofile.disable()
    cpu, wait1, wall = time.process_time() - cpu0, cpu_wait_s(), time.monotonic() - wall0
    server_cpu = live_cpu_s(server_pid) if server_pid else None
    n = len(requests)
    (e50, e99), (w50, w99) = percentiles(errors), percentiles(waits)
    return {"kind": kind, "n": n, "ok": ok, "warm": warm, "peak_in_flight": peak, "err_p50_us": e50, "err_p99_us": e99,
            "wait_p50_us": w50, "wait_p99_us": w99, "client_cpu_us": 1e6 * cpu / n,
            "client_cpu_wait": None if wait0 is None or wait1 is None else (wait1 - wait0) / wall,
            "server_cpu_us": None if server_cpu is None or server_cpu0 is None else 1e6 * (server_cpu - server_cpu0) / n}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="100,1000,5000", help="mean requests/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0, help="replayed wall seconds per run (trace allowing)")
    parser.add_argument("--runs", type=int, default=1, help="runs per rate and replayer (interleaved)")
    parser.add_argument("--no-naive", action="store_true", help="replay with traces.replay only")
    parser.add_argument("--in-process", action="store_true", help="run the emulator in the replay's own loop")
    parser.add_argument("--cprofile", help="write a cProfile of the client's replays (traces.replay only) here")
    parser.add_argument("--stream-interval-s", type=float, default=0.0,
                        help="the emulator's real seconds between stream writes (0: every token when due, as vLLM)")
    parser.add_argument("--warm", type=int, help="connections the harness's replay opens before the origin "
                        "(default: `traces.replay.warm_pool_size` under the emulator's model)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per run instead of a table")
    args = parser.parse_args()
    if not TRACE.exists():
        print(f"skipped: {TRACE} not found (the shared traces folder is absent; OCS_HIL_SHARED names it)")
        return 0
    full = traces.load_requests(TRACE)
    trace_rate = (len(full) - 1) / (full["arrival_s"].iloc[-1] - full["arrival_s"].iloc[0])
    cprofile = None
    if args.cprofile:
        import cProfile

        cprofile = cProfile.Profile(time.process_time)
    kinds = ["harness"] + ([] if args.no_naive else ["naive"])
    rows = []
    print(f"trace {TRACE.name}: {len(full)} requests, {trace_rate:.2f} requests/s; server "
          f"{'in the replay process' if args.in_process else 'in its own process'}, stream interval "
          f"{args.stream_interval_s:g} s; load average at start "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}", file=sys.stderr)
    for rate in (float(r) for r in args.rates.split(",")):
        scale = rate / trace_rate
        requests = full.iloc[: min(len(full), max(2, int(rate * args.seconds)))].reset_index(drop=True)
        for _ in range(args.runs):
            for kind in kinds:
                load = os.getloadavg()[0]
                row = run_one(kind, requests, scale, args, cprofile if kind == "harness" else None)
                row.update(rate=rate, scale=scale, load=load)
                rows.append(row)
                if args.json:
                    print(json.dumps(row), flush=True)
                else:
                    print(f"  {rate:6.0f} req/s {kind:8s} done (load {load:.1f})", file=sys.stderr, flush=True)
    if cprofile is not None:
        cprofile.dump_stats(args.cprofile)
    if not args.json:
        print_table(rows)
    return 0


def run_one(kind: str, requests, scale: float, args, cprofile) -> dict:
    if args.in_process:
        async def body():
            from devices.emulated.vllm_server import ServiceModel, VllmEmulator

            emulator = VllmEmulator(ServiceModel(time_scale=scale, stream_interval_s=args.stream_interval_s),
                                    keep_records=False)
            await emulator.start()
            try:
                return await measure(kind, requests, scale, emulator.url, None, cprofile, args.warm)
            finally:
                await emulator.stop()
        return run_loop(body())
    proc, url = start_server(scale, args.stream_interval_s)
    try:
        return run_loop(measure(kind, requests, scale, url, proc.pid, cprofile, args.warm))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def print_table(rows: list[dict]) -> None:
    f = lambda v: "—" if v is None else (f"{v / 1e3:.2f} ms" if v >= 1e3 else f"{v:.0f} µs")  # noqa: E731
    print("| req/s | replay | requests (ok) | warm | in flight (peak) | send error p50 | p99 | connection wait p50 | p99 | "
          "client CPU/req | server CPU/req | client waiting for a CPU | load |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        server = "—" if r["server_cpu_us"] is None else f"{r['server_cpu_us']:.0f} µs"
        peak = "—" if r["peak_in_flight"] is None else r["peak_in_flight"]
        starved = "—" if r["client_cpu_wait"] is None else f"{r['client_cpu_wait']:.0%}"
        print(f"| {r['rate']:.0f} | {r['kind']} | {r['n']} ({r['ok']}) | {r['warm']} | {peak} | {f(r['err_p50_us'])} | "
              f"{f(r['err_p99_us'])} | {f(r['wait_p50_us'])} | {f(r['wait_p99_us'])} | {r['client_cpu_us']:.0f} µs | "
              f"{server} | {starved} | {r['load']:.1f} |")


if __name__ == "__main__":
    raise SystemExit(main())
