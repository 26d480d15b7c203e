"""The emulated bench's random delays: each drawn from a stream keyed by (seed, domain, command, stage, index) and
recorded column-wise (`DrawLog`), so the same seed and the same commands give identical delays whatever the thread
timing, and a run can list every delay it drew."""
from __future__ import annotations

import threading

import numpy as np

from devices.emulated.columns import Column
from devices.emulated.profile import NIC_KEYS, OCS_KEYS, OPTIONAL_NIC_KEYS

# Stream key of every random quantity: (domain, command, stage) -> one value per port (or per host).
# The optional stages come last: the others keep their codes, so a profile without them draws as before.
STREAM_STAGES = OCS_KEYS + NIC_KEYS + ("clock_offset", "clock_drift") + OPTIONAL_NIC_KEYS
STAGE_CODE = {stage: i for i, stage in enumerate(STREAM_STAGES)}
OCS, NIC, CLOCK, ADMIN = 0, 1, 2, 3  # domains; ADMIN: re-training after `ip link set up` (its own streams)


class KeyedStreams:
    """Uniform draws keyed by (seed, domain, command, stage, index): SeedSequence spawn keys, so a value depends
    on its key alone, never on how many draws came before it. One block of `size` values per
    (domain, command, stage), cached while recent."""

    _KEEP = 256

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._blocks: dict[tuple[int, int, int], np.ndarray] = {}

    def uniform(self, domain: int, command: int, stage: str, index: int, size: int) -> float:
        key = (domain, command, STAGE_CODE[stage])
        block = self._blocks.get(key)
        if block is None or len(block) < size:
            words = np.random.SeedSequence(self.seed, spawn_key=key).generate_state(size, np.uint64)
            block = (words >> np.uint64(11)).astype(np.float64) * 2.0**-53  # [0, 1) with 53 bits
            self._blocks[key] = block
            if len(self._blocks) > self._KEEP:
                del self._blocks[next(iter(self._blocks))]
        return float(block[index])


class DrawLog:
    """Delays drawn from `streams` at a profile delay's quantile, each recorded: command, port index (-1: the
    switch), stage code, delay, how much later than drawn the bench realised it and when its action was due
    (`late_ns` and `due_ns`, which the schedule fills in: devices.emulated.schedule; due -1 until it ran).
    Column-wise, on disk but for the last chunk: a pod draws ~10^4 per cycle, a campaign ~10^7. Not thread-safe:
    its owner holds one lock around every draw and the schedule's runs."""

    _COLUMNS = (("command", "q"), ("port", "l"), ("stage", "b"), ("delay_ns", "q"), ("late_ns", "q"), ("due_ns", "q"))

    def __init__(self, streams: KeyedStreams):
        self.streams = streams
        self.columns = {k: Column(t) for k, t in self._COLUMNS}
        self.late_ns, self.due_ns = self.columns["late_ns"], self.columns["due_ns"]

    def draw(self, domain: int, command: int, stage: str, delay, index: int, size: int) -> tuple[int, int]:
        """(delay ns, draw index) of `delay` at the quantile keyed (domain, command, stage, index) of `size`;
        index -1: the switch (drawn as index 0 of 1)."""
        u = self.streams.uniform(domain, command, stage, *((0, 1) if index < 0 else (index, size)))
        ns = int(delay.at_quantile(u) * 1e9)
        cols = self.columns
        cols["command"].append(command)
        cols["port"].append(index)
        cols["stage"].append(STAGE_CODE[stage])
        cols["delay_ns"].append(ns)
        cols["late_ns"].append(0)
        cols["due_ns"].append(-1)
        return ns, len(cols["delay_ns"]) - 1

    def __len__(self) -> int:
        return len(self.columns["command"])

    def frame(self, port_names: list[str], lock: threading.Lock, start: int = 0, stop: int | None = None):
        """The draws [start, stop) as a DataFrame (command, port, stage, delay_ns, late_ns, due_ns); `port_names[i]`
        names port index i, "ocs" index -1 (Arrow strings taken by code). The columns are copied under
        `lock`, the owner's."""
        import pandas as pd

        from devices.emulated.columns import coded_strings

        names = list(port_names) + ["ocs"]  # index -1: the switch
        with lock:
            stop = len(self) if stop is None else stop
            cols = {k: v.numpy(start, stop) for k, v in self.columns.items()}
        port = cols["port"].astype(np.int64)
        port[port < 0] += len(names)
        return pd.DataFrame({"command": cols["command"].astype(np.int64), "port": coded_strings(names, port),
                             "stage": coded_strings(STREAM_STAGES, cols["stage"]),
                             "delay_ns": cols["delay_ns"].astype(np.int64),
                             "late_ns": cols["late_ns"].astype(np.int64), "due_ns": cols["due_ns"].astype(np.int64)},
                            columns=["command", "port", "stage", "delay_ns", "late_ns", "due_ns"])
