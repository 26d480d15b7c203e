"""The emulated host's GPUs: `nvidia-smi` (its default table, `--query-gpu` once or in a loop, `topo -m`)."""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import NamedTuple

from devices.emulated import formats
from devices.emulated.host.context import ExecContext, Handler
from devices.emulated.host.streams import Stream
from devices.timing import now_ns


GPU_BUSY = {"utilization_gpu": 97, "utilization_memory": 41, "power_draw_w": 612.4}  # a training step computing
GPU_STALLED = {"utilization_gpu": 0, "utilization_memory": 0, "power_draw_w": 118.3}  # waiting on its all-to-all


def _gpus_now(ctx: ExecContext, gpus: list) -> list:
    """The emulated host runs a data-parallel job whose collectives need every one of its NIC ports: its GPUs
    compute while all are ACTIVE and stall (idle) from the moment one is not — the network re-training."""
    busy = all(snap.ib_state == "ACTIVE" for _, snap in ctx.server.ports_with_state())
    return [_gpu_in(gpu, busy) for gpu in gpus]


@functools.lru_cache(maxsize=4096)
def _gpu_in(gpu, busy: bool):
    """`gpu` computing or stalled (two states per GPU: the GPU view samples every host several times a second,
    and dataclasses.replace costs ~20 µs a call)."""
    return replace(gpu, **(GPU_BUSY if busy else GPU_STALLED))


def _nvidia_smi(ctx: ExecContext, argv: list[str]) -> int:
    fields: list[str] | None = None
    fmt: list[str] = []
    index: set[int] | None = None
    loop_ms: int | None = None
    args = argv[1:]
    if args[:1] == ["topo"]:
        if args[1:] != ["-m"]:
            ctx.err("emulated nvidia-smi topo supports -m only\n")
            return 2
        ctx.out(formats.nvidia_smi_topo(ctx.server.gpus, sorted({m.rdma_dev for m in ctx.bench.nic_ports(ctx.host)})))
        return 0
    for i, arg in enumerate(args):
        if arg.startswith("--query-gpu="):
            fields = [f.strip() for f in arg.split("=", 1)[1].split(",") if f.strip()]
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1].split(",")
        elif arg in ("-i", "--id") and i + 1 < len(args):
            index = {int(x) for x in args[i + 1].split(",") if x.isdigit()}
        elif arg.startswith("--id="):
            index = {int(x) for x in arg.split("=", 1)[1].split(",") if x.isdigit()}
        elif arg in ("-l", "--loop", "-lms", "--loop-ms") or arg.startswith(("--loop=", "--loop-ms=")):
            name, _, value = arg.partition("=")
            value = value or (args[i + 1] if i + 1 < len(args) else "")
            if not value.isdigit() or int(value) <= 0:
                ctx.err(f"Invalid value for {name}: {value!r}\n")
                return 2
            loop_ms = int(value) * (1 if name in ("-lms", "--loop-ms") else 1000)
    if not args:
        ctx.out(formats.nvidia_smi_table(_gpus_now(ctx, ctx.server.gpus), ctx.bench.host_clock_ns(ctx.host)))
        return 0
    if fields is None or "csv" not in fmt:
        ctx.err("emulated nvidia-smi supports no option (the default table), "
                "--query-gpu=FIELDS --format=csv[,noheader][,nounits] "
                "[-lms MS | -l S] only\n")
        return 2
    for field in fields:
        if field not in formats.GPU_FIELDS:
            ctx.out(f'Field "{field}" is not a valid field to query.\n\n')
            return 2
    chosen = [g for g in ctx.server.gpus if index is None or g.index in index]
    header, units = "noheader" not in fmt, "nounits" not in fmt
    if loop_ms is not None:
        stream = _GpuQueryLoop(ctx, chosen, fields, units, loop_ms * 1_000_000)
        return stream.serve(lambda: stream.query(header))
    ctx.out(formats.nvidia_smi_query(_gpus_now(ctx, chosen), fields, ctx.bench.host_clock_ns(ctx.host),
                                     header=header, units=units))
    return 0


class _GpuTick(NamedTuple):
    """A looping `nvidia-smi`'s next query, routed like a physics change to its own stream."""

    netdev: str
    field: str
    t_ns: int


class _GpuQueryLoop(Stream):
    """`nvidia-smi --query-gpu=... --format=csv... -lms N` (`-l S`): the query printed at once (the header,
    unless `noheader`, only then), then again `interval` after each query until the client goes away: each
    query stamps its own `timestamp` (host clock, ms). Its timer rides on the host's `AgentStreams` thread:
    each query arms the next as a `_GpuTick` due then (no thread, no wake-up in between)."""

    def __init__(self, ctx: ExecContext, gpus: list, fields: list[str], units: bool, interval: int):
        super().__init__(ctx)
        self.gpus, self.fields, self.units, self.interval = gpus, fields, units, interval
        self.keys = (("", f"nvidia-smi-loop-{id(self)}"),)

    @staticmethod
    def grid(field: str) -> tuple[int, int]:
        return 0, 0  # due at the tick's own time

    def query(self, header: bool = False) -> str:
        ctx = self.ctx
        text = formats.nvidia_smi_query(_gpus_now(ctx, self.gpus), self.fields, ctx.bench.host_clock_ns(ctx.host),
                                        header=header, units=self.units)
        ctx.server.agent_streams().arm(_GpuTick(*self.keys[0], now_ns() + self.interval))  # sleeps, then again
        return text

    def lines(self, items: list) -> str:
        return self.query()


COMMANDS: dict[str, Handler] = {"nvidia-smi": _nvidia_smi}
