"""The bench's serving side: a timed replay of requests against an OpenAI-compatible endpoint — the one the
step names, or the emulated vLLM endpoint with its interference windows — on one asyncio loop."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import signal
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pandas as pd

from harness.errors import Aborted, InputError

LOOPBACK_NAMES = ("localhost",)


def check_endpoint(step, endpoint: str, real_bench: bool) -> str | None:
    """None for the emulated endpoint, else the validated base URL (InputError at the step's line)."""
    if endpoint == "emulated":
        return None

    def bad(message: str) -> InputError:
        return InputError(f"step {step.name}: {message}", step.file, step.line)

    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise bad(f"endpoint must be 'emulated' or an http://HOST:PORT URL, found {endpoint!r}")
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise bad(f"endpoint has an invalid port: {endpoint!r}") from None
    host = parts.hostname
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host.lower() in LOOPBACK_NAMES
    if not loopback and not real_bench:
        raise bad(f"endpoint {host} is not a loopback address: on an emulated bench the replay only talks to "
                  "127.0.0.1 (use 'emulated', or run on a real bench inventory)")
    return endpoint.rstrip("/")


async def serve_and_replay(requests: pd.DataFrame, url: str | None, p: dict, windows: pd.DataFrame | None,
                           log_path: Path):
    from devices.timing import now_ns
    from analysis.serving import ServiceModel
    from harness.bench.emulated import ServingEndpoint
    from traces.replay import ReplayConfig, prepared_prompts, replay_requests, warm_pool_size

    async with contextlib.AsyncExitStack() as stack:
        emulator = None if url is not None else await stack.enter_async_context(ServingEndpoint(p))
        warm = p.get("warm_connections") or warm_pool_size(requests, ServiceModel.of_step(p), p["max_connections"])
        config = ReplayConfig(url=url or emulator.url, model=p["model"], time_scale=p["time_scale"],
                              timeout_s=p["timeout_s"], max_connections=p["max_connections"],
                              prompt_seed=p.get("prompt_seed", 0), warm_connections=warm)
        prompts = prepared_prompts(requests, config)  # before the origin: the lead time is for connections
        origin = now_ns() + int(p["lead_s"] * 1e9)
        if emulator is not None and windows is not None and len(windows):
            # The replay sends the first request at the origin; windows are in the trace's own seconds.
            epoch = origin - int(round(float(requests["arrival_s"].iloc[0]) * 1e9 / p["time_scale"]))
            emulator.interfere(windows, p["interference_capacity"], epoch)
        return await replay_requests(requests, dataclasses.replace(config, origin_ns=origin), log_path, prompts)


def run_replay(requests: pd.DataFrame, url: str | None, p: dict, windows: pd.DataFrame | None,
               log_path: Path):
    """One asyncio loop for the endpoint and the replay. SIGTERM cancels the replay (in-flight requests get
    their records, the log is flushed) and then raises the runner's Aborted, so teardown runs as usual."""

    terminated: list[bool] = []

    async def main():
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGTERM, lambda: (terminated.append(True), task.cancel()))
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signal support
            pass
        return await serve_and_replay(requests, url, p, windows, log_path)

    from traces.replay import run_loop

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if in_main_thread else None
    try:
        return run_loop(main())
    except asyncio.CancelledError:
        if terminated:
            raise Aborted("SIGTERM") from None
        raise
    finally:
        if in_main_thread and previous is not None:
            signal.signal(signal.SIGTERM, previous)  # the loop reset it to the default on close
