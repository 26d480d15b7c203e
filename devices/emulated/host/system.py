"""The emulated host's identity and clock tools: `hostname`, `uname`, `date`, `chronyc tracking`."""
from __future__ import annotations

import time

from devices.emulated import formats
from devices.emulated.host.context import ExecContext, Handler


def _hostname(ctx: ExecContext, argv: list[str]) -> int:
    ctx.out(ctx.host + "\n")
    return 0


def _date(ctx: ExecContext, argv: list[str]) -> int:
    host_ns = ctx.bench.host_clock_ns(ctx.host)
    fmt = argv[1] if len(argv) > 1 else None
    if fmt == "+%s.%N":
        ctx.out(formats.date_ns(host_ns))
    elif fmt == "+%s%N":
        ctx.out(f"{host_ns}\n")
    elif fmt == "+%s":
        ctx.out(f"{host_ns // 1_000_000_000}\n")
    elif fmt is None:
        ctx.out(time.strftime("%a %b %e %H:%M:%S %Z %Y\n", time.localtime(host_ns // 1_000_000_000)))
    else:
        ctx.err(f"date: emulated host supports +%s.%N, +%s%N, +%s; got {fmt!r}\n")
        return 1
    return 0


def _chronyc(ctx: ExecContext, argv: list[str]) -> int:
    if argv[1:] not in (["tracking"], ["-c", "tracking"]):
        ctx.err("chronyc: emulated host supports 'chronyc [-c] tracking' only\n")
        return 1
    host_ns = ctx.bench.host_clock_ns(ctx.host)
    offset_s = (host_ns - time.time_ns()) / 1e9  # against this machine's realtime, the emulated hosts' "NTP time"
    params = getattr(ctx.bench, "host_clock_params", None)
    drift = params(ctx.host)["drift_ppm"] if params else 0.0
    csv = argv[1] == "-c"
    ctx.out(formats.chronyc_tracking_csv(offset_s, drift, ref_time_s=host_ns / 1e9 - 1.0) if csv
            else formats.chronyc_tracking(offset_s, drift))
    return 0


def _uname(ctx: ExecContext, argv: list[str]) -> int:
    """`uname [-snrvmpioa]`: the fields asked for, in uname's own order; none asked is `-s`."""
    letters = "".join(a[1:] for a in argv[1:]) if all(a.startswith("-") for a in argv[1:]) else "?"
    if letters.strip(formats.UNAME_OPTIONS + "a"):
        ctx.err(f"uname: invalid option -- '{letters.strip(formats.UNAME_OPTIONS + 'a')[0]}'\n"
                "Try 'uname --help' for more information.\n")
        return 1
    fields = formats.uname_fields(ctx.host)
    chosen = [f for flag, f in zip(formats.UNAME_OPTIONS, fields) if flag in letters or "a" in letters] or fields[:1]
    ctx.out(" ".join(chosen) + "\n")
    return 0


COMMANDS: dict[str, Handler] = {"hostname": _hostname, "uname": _uname, "date": _date, "chronyc": _chronyc}
