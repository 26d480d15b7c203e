"""The emulated benchmark tools (protocols.md §3.2, §3.3): nccl-tests `alltoall_perf` and perftest `ib_write_bw`.

Emulated data plane: a NIC pair whose cross-connects are patched both ways and whose two ports are ACTIVE
(the mirrors settled and the links trained) moves data at the circuit rate; anything else crosses the
packet fabric at `eps_gbps` per NIC. Each transfer really takes its time (sleep), divided by
`--time-scale`; the tools report the elapsed time multiplied back, as a real tool reports what it measured.
"""
from __future__ import annotations

import hashlib

from devices.emulated import dataplane, formats, leafspine
from devices.emulated.host.context import ExecContext, Handler, fake_pid
from devices.timing import now_ns


EPS_GBPS_DEFAULT = 100.0  # packet-fabric bandwidth per NIC when a pair has no circuit
TRANSFER_LATENCY_US_DEFAULT = 10.0  # fixed start-up cost of one emulated transfer (launch, handshake)
_BYTES_PER_GBIT = 1.25e8
_TRANSFER_WAKE_NS = 20_000_000  # an emulated tool re-reads the fabric at least this often while it waits
_NCCL_TYPES = {"int8": 1, "char": 1, "uint8": 1, "int32": 4, "int": 4, "uint32": 4, "int64": 8, "uint64": 8,
               "half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4, "double": 8, "float64": 8}
_SIZE_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class _ToolUsage(ValueError):
    """A benchmark tool's command line is wrong (printed to stderr, exit status 1)."""


def _size(word: str) -> int:
    """nccl-tests / perftest sizes: bytes with an optional K, M or G (powers of 1024) suffix."""
    text = word.strip().upper()
    suffix = text[-1] if text and text[-1] in "KMG" else ""
    try:
        value = int(text[:-1] if suffix else text) * _SIZE_SUFFIX[suffix]
    except ValueError:
        raise _ToolUsage(f"invalid size {word!r}") from None
    if value < 0:
        raise _ToolUsage(f"invalid size {word!r}")
    return value


def _positive(word: str, what: str) -> float:
    try:
        value = float(word)
    except ValueError:
        raise _ToolUsage(f"{what} must be a number, got {word!r}") from None
    if not value > 0 or value == float("inf"):
        raise _ToolUsage(f"{what} must be > 0, got {word!r}")
    return value


def _tool_options(argv: list[str], with_value: dict[str, str], flags: dict[str, str]
                  ) -> tuple[dict[str, str | bool], list[str]]:
    """Short/long options -> canonical names (`-b 8`, `--minbytes=8`, `--minbytes 8`), plus positionals."""
    values: dict[str, str | bool] = {}
    positional: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        name, eq, inline = word.partition("=") if word.startswith("--") else (word, "", "")
        if name in flags:
            values[flags[name]] = True
        elif name in with_value:
            if not eq:
                i += 1
                if i >= len(argv):
                    raise _ToolUsage(f"option {name} needs a value")
                inline = argv[i]
            values[with_value[name]] = inline
        elif word.startswith("-") and word != "-":
            raise _ToolUsage(f"unknown option {word}")
        else:
            positional.append(word)
        i += 1
    return values, positional


def _port_by_key(ctx: ExecContext, key: str):
    host, sep, netdev = key.partition(":")
    if not sep:
        return None
    return next((m for m in ctx.bench.all_nic_ports() if m.host == host and m.netdev == netdev), None)


def _circuit_up(bench, patches: dict[int, int], a, b) -> bool:
    """Patched both ways and both ends ACTIVE: light arrived on each side and the links trained."""
    if patches.get(a.ocs_tx) != b.ocs_rx or patches.get(b.ocs_tx) != a.ocs_rx:
        return False
    return all(bench.nic_snapshot(m.host, m.netdev).ib_state == "ACTIVE" for m in (a, b))


class _DataPlane:
    """Rates and latency of one tool invocation (command line, else the host's settings)."""

    def __init__(self, ctx: ExecContext, opts: dict):
        self.ctx = ctx
        server = ctx.server
        self.link_gbps = _positive(opts["link-gbps"], "--link-gbps") if "link-gbps" in opts else server.link_gbps
        self.eps_bytes_s = (_positive(opts["eps-gbps"], "--eps-gbps") if "eps-gbps" in opts
                            else server.eps_gbps) * _BYTES_PER_GBIT
        latency_us = float(opts.get("latency-us", server.transfer_latency_us))
        if not latency_us >= 0:
            raise _ToolUsage("--latency-us must be >= 0")
        self.latency_s = latency_us / 1e6
        self.time_scale = _positive(opts["time-scale"], "--time-scale") if "time-scale" in opts else 1.0

    def circuit_bytes_s(self, a, b) -> float:
        if self.link_gbps is not None:
            return self.link_gbps * _BYTES_PER_GBIT
        speed = min(self.ctx.bench.nic_snapshot(m.host, m.netdev).speed_mbps for m in (a, b))
        return speed / 1000 * _BYTES_PER_GBIT

    def pair_bytes_s(self, me, peer) -> float:
        return (self.circuit_bytes_s(me, peer) if _circuit_up(self.ctx.bench, self.ctx.bench.ocs_patches(), me, peer)
                else self.eps_bytes_s)

    def run(self, me, plan: list[list[tuple[object, float, float]]]) -> list[tuple[int, int]] | None:
        """`me`'s transfers back to back from now (per transfer: (peer, bytes to send, to receive)), integrated
        over the physics (devices/emulated/dataplane.py) and counted on `me`'s port. Sleeps until they end
        (time-scaled: rates × time_scale); each transfer's (start, end) on the harness clock, None if the
        client went away."""
        scale = self.time_scale
        steps = [[(m.key, send, recv, self.circuit_bytes_s(me, m) * scale) for m, send, recv in step] for step in plan]
        view = dataplane.fabric(self.ctx.bench)
        chain = dataplane.counters(self.ctx.bench, me.key).start(
            lambda t0: dataplane.Chain(view, me.key, steps, self.eps_bytes_s * scale,
                                       int(self.latency_s / scale * 1e9), t0), now_ns)
        return _to_the_end(chain, self.ctx.sleep)


_RENDEZVOUS_S = 30.0  # NCCL's own bootstrap gives up after a while; a rank alone waits this long


def _on_leafspine(ctx: ExecContext, plane: _DataPlane, declared, me, plan) -> list[tuple[int, int]] | None:
    """The rank's transfers as part of the collective of `me` and its peers over the emulated leaf–spine
    (devices/emulated/leafspine.py): every rank joins, the collective starts when the last has."""
    steps = [[(m.key, send, recv) for m, send, recv in step] for step in plan]
    group = leafspine.join(ctx.bench, declared, me.key, steps, int(plane.latency_s / plane.time_scale * 1e9),
                           plane.time_scale, ctx.bench.nic_snapshot(me.host, me.netdev).speed_mbps / 1000)
    deadline = now_ns() + int(_RENDEZVOUS_S * 1e9)
    while group["collective"] is None and group["error"] is None:
        if now_ns() > deadline:
            ctx.err(f"alltoall_perf: {me.key}: the other ranks did not join within {_RENDEZVOUS_S:g} s\n")
            return None
        if not ctx.sleep(0.001):
            return None
    if group["error"]:
        ctx.err(f"alltoall_perf: {group['error']}\n")
        return None
    coll = group["collective"]
    view = dataplane.counters(ctx.bench, me.key).start(lambda _t0: leafspine.RankView(coll, me.key), now_ns)
    return _to_the_end(view, ctx.sleep)


def _to_the_end(transfer, sleep) -> list[tuple[int, int]] | None:
    """Advance a rank's transfers until they end: their (start, end) intervals, None if the client went away.
    The result does not depend on when we wake; waking in steps only ends the command near its end."""
    while True:
        now = now_ns()
        transfer.advance(now)
        if transfer.finish_ns is not None:
            return transfer.intervals()
        if not sleep(max(min(transfer.projected_finish_ns() - now, _TRANSFER_WAKE_NS) / 1e9, 0.0)):
            return None


def _fabric_link(ctx: ExecContext, argv: list[str]) -> int:
    """`fabric_link PLANE LEAF SPINE down|up`: a leaf–spine link of the emulated fabric shut or opened (the
    leaf's port, as a switch CLI does it); prints the harness ns it took effect."""
    try:
        plane, leaf, spine = (int(x) for x in argv[1:4])
        state = argv[4]
        if len(argv) != 5 or state not in ("down", "up") or min(plane, leaf, spine) < 0:
            raise ValueError
    except (ValueError, IndexError):
        ctx.err("usage: fabric_link PLANE LEAF SPINE down|up\n")
        return 1
    links = leafspine.links_of(ctx.bench, leafspine.detection_of(ctx.bench))
    ctx.out(f"{links.set_state((plane, leaf, spine), state == 'up')}\n")
    return 0


def _device_index(ctx: ExecContext, model) -> int:
    return [m.netdev for m in ctx.bench.nic_ports(model.host)].index(model.netdev)


_ALLTOALL_USAGE = ("usage: alltoall_perf [-b MINBYTES] [-e MAXBYTES] [-f FACTOR | -i STEPBYTES] [-g 1] [-n ITERS] "
                   "[-w WARMUP] [-c 0|1] [-d TYPE] --peers HOST:NETDEV[=SEND[/RECV]],... [--self HOST:NETDEV] "
                   "[--link-gbps G] [--eps-gbps G] [--latency-us U] [--time-scale S] [--fabric planes=P,per_leaf=L,spines=S,lb=M,seed=N]\n")


def _alltoall_perf(ctx: ExecContext, argv: list[str]) -> int:
    """nccl-tests `alltoall_perf` for one rank (this host's NIC `--self`, default its first) against the
    ranks in `--peers`. Without byte counts each peer gets size/nranks, as in alltoall; with
    `=SEND[/RECV]` (RECV defaults to SEND) the counts are this rank's traffic at size = ΣSEND and scale
    with the swept size. Sizes, iterations and columns follow nccl-tests (in-place is timed too)."""
    try:
        opts, positional = _tool_options(argv[1:], {
            "-b": "b", "--minbytes": "b", "-e": "e", "--maxbytes": "e", "-f": "f", "--stepfactor": "f",
            "-i": "i", "--stepbytes": "i", "-g": "g", "--ngpus": "g", "-t": "t", "--nthreads": "t",
            "-n": "n", "--iters": "n", "-w": "w", "--warmup_iters": "w", "-c": "c", "--check": "c",
            "-d": "d", "--datatype": "d", "-o": "o", "--op": "o", "-z": "z", "--blocking": "z",
            "--peers": "peers", "--self": "self", "--link-gbps": "link-gbps", "--eps-gbps": "eps-gbps",
            "--latency-us": "latency-us", "--time-scale": "time-scale", "--fabric": "fabric"}, {})
        if positional:
            raise _ToolUsage(f"unexpected argument {positional[0]!r}")
        declared = leafspine.Declared.parse(str(opts["fabric"])) if "fabric" in opts else None
        if opts.get("g", "1") != "1" or opts.get("t", "1") != "1":
            raise _ToolUsage("the emulated alltoall_perf runs one rank per process (-g 1 -t 1)")
        dtype = str(opts.get("d", "float"))
        if dtype not in _NCCL_TYPES:
            raise _ToolUsage(f"invalid type {dtype}")
        me = _port_by_key(ctx, str(opts["self"])) if "self" in opts else ctx.server.bench.nic_ports(ctx.host)[0]
        if me is None or me.host != ctx.host:
            raise _ToolUsage(f"--self {opts.get('self')!r} is not a NIC port of {ctx.host}")
        peers: list[tuple[object, float | None, float | None]] = []
        for spec in filter(None, str(opts.get("peers", "")).split(",")):
            key, eq, amounts = spec.partition("=")
            model = _port_by_key(ctx, key)
            if model is None or model == me:
                raise _ToolUsage(f"--peers: no such peer NIC port {key!r} (HOST:NETDEV)")
            send, _, recv = amounts.partition("/")
            peers.append((model, float(_size(send)) if eq else None, float(_size(recv or send)) if eq else None))
        if not peers:
            raise _ToolUsage("--peers: at least one peer HOST:NETDEV is needed")
        explicit = [p[1] is not None for p in peers]
        if any(explicit) and not all(explicit):
            raise _ToolUsage("--peers: give byte counts for every peer or for none")
        total_send = sum(p[1] for p in peers) if all(explicit) else 0.0
        default_size = int(total_send) if all(explicit) else 32 << 20
        min_bytes = _size(str(opts["b"])) if "b" in opts else default_size
        max_bytes = _size(str(opts["e"])) if "e" in opts else max(min_bytes, default_size)
        factor = int(opts.get("f", 2)) if "i" not in opts else 1
        step_bytes = _size(str(opts["i"])) if "i" in opts else 0
        iters, warmup = int(opts.get("n", 20)), int(opts.get("w", 5))
        check = str(opts.get("c", "1")) != "0"
        if max_bytes < min_bytes or iters < 1 or warmup < 0 or (factor < 2 and step_bytes <= 0):
            raise _ToolUsage("need minbytes <= maxbytes, iters >= 1, warmup >= 0 and a growing size sweep")
        plane = _DataPlane(ctx, opts)
    except (_ToolUsage, ValueError) as exc:
        ctx.err(f"alltoall_perf: {exc}\n{_ALLTOALL_USAGE}")
        return 1
    nranks = len(peers) + 1
    word = _NCCL_TYPES[dtype]

    def rank_traffic(size: int) -> list[tuple[object, float, float]]:
        if all(explicit):
            scale = size / total_send if total_send > 0 else 0.0
            return [(m, s * scale, r * scale) for m, s, r in peers]
        return [(m, size / nranks, size / nranks) for m, _, _ in peers]

    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        grown = size * factor if step_bytes <= 0 else size + step_bytes
        if grown <= size:  # a sweep from 0 bytes by a factor stays at 0: one row
            break
        size = grown
    counts = (warmup, iters, iters)  # warm-up, out-of-place, in-place
    plan = [rank_traffic(size) for size in sizes for n in counts for _ in range(n)]
    intervals = plane.run(me, plan) if declared is None else _on_leafspine(ctx, plane, declared, me, plan)
    if intervals is None:
        return 1

    def mean_s(first: int, count: int) -> float:
        """Mean seconds of `count` transfers from the `first`-th, as the fabric realised them."""
        spans = intervals[first:first + count]
        return (spans[-1][1] - spans[0][0]) / 1e9 * plane.time_scale / max(count, 1)

    rows, index = [], 0
    for size in sizes:
        index += warmup
        phases = []
        for _ in ("out-of-place", "in-place"):
            seconds = mean_s(index, iters)
            index += iters
            algbw = size / 1e9 / seconds if seconds > 0 else 0.0
            phases.append(formats.NcclTiming(seconds * 1e6, algbw, algbw * (nranks - 1) / nranks,
                                             0 if check else None))
        rows.append((size, size // word, dtype, "none", -1, phases[0], phases[1]))
    ranks = [formats.NcclRank(r, m.host, _device_index(ctx, m), fake_pid(m.host, m.netdev), 0x18 + 0x10 * r,
                              formats.EmulatedGpu(0).name) for r, m in enumerate([me] + [p[0] for p in peers])]
    ctx.out(formats.nccl_tests_output("alltoall_perf", ranks, rows, min_bytes=min_bytes, max_bytes=max_bytes,
                                      step_factor=factor, warmup_iters=warmup, iters=iters, check=check,
                                      tools=ctx.server.tools))
    return 0


def _perftest_end(model) -> formats.PerftestEnd:
    """Stable per-NIC connection identifiers (RoCE: GID = IPv4-mapped address from the MAC)."""
    digest = int(hashlib.sha256(model.key.encode()).hexdigest()[:16], 16)
    mac = [int(x, 16) for x in model.mac.split(":")]
    gid = bytes(10) + b"\xff\xff" + bytes([10, mac[3], mac[4], 1])
    return formats.PerftestEnd(lid=0, qpn=0x100 + model.ifindex, psn=digest & 0xFFFFFF, rkey=(digest >> 24) & 0x1FFFFF,
                               vaddr=0x7F0000000000 | ((digest >> 8) & 0xFFFFFFF000), gid=gid)


def _ib_write_bw(ctx: ExecContext, argv: list[str]) -> int:
    """perftest `ib_write_bw` client: `ib_write_bw -d DEV [-i PORT] [-s BYTES] [-n ITERS] [--report_gbits]
    SERVER` with SERVER a host name (the peer NIC: the one our circuit reaches there, else the same RDMA
    device name) or HOST:NETDEV. Writes iters × size bytes one way over the current data plane."""
    try:
        opts, positional = _tool_options(argv[1:], {
            "-d": "d", "--ib-dev": "d", "-i": "i", "--ib-port": "i", "-s": "s", "--size": "s", "-n": "n",
            "--iters": "n", "-q": "q", "--qp": "q", "-x": "x", "--gid-index": "x", "-m": "m", "--mtu": "m",
            "-p": "p", "--port": "p", "--link-gbps": "link-gbps", "--eps-gbps": "eps-gbps",
            "--latency-us": "latency-us", "--time-scale": "time-scale"},
            {"-F": "F", "--CPU-freq": "F", "--report_gbits": "gbits", "-R": "R", "--rdma_cm": "R"})
        if len(positional) != 1:
            raise _ToolUsage("the emulated ib_write_bw runs the client side: give the server (HOST or "
                             "HOST:NETDEV)")
        dev = str(opts.get("d", ""))
        port = int(opts.get("i", 0)) or None
        me = ctx.server.nic_by_rdma(dev, port) if dev else ctx.bench.nic_ports(ctx.host)[0]
        if me is None:
            ctx.err(f" IB device {dev} not found\n Unable to find the Infiniband/RoCE device\n")
            return 1
        size, iters = _size(str(opts.get("s", "65536"))), int(opts.get("n", 5000))
        qps, mtu, gid_index = int(opts.get("q", 1)), int(opts.get("m", 4096)), int(opts.get("x", 3))
        if size < 1 or iters < 1:
            raise _ToolUsage("size and iterations must be >= 1")
        plane = _DataPlane(ctx, opts)
    except (_ToolUsage, ValueError) as exc:
        ctx.err(f"ib_write_bw: {exc}\n")
        return 1
    host, _, netdev = positional[0].partition(":")
    candidates = [m for m in ctx.bench.all_nic_ports() if m.host == host and m.host != ctx.host]
    if netdev:
        candidates = [m for m in candidates if m.netdev == netdev]
    if not candidates:
        ctx.err(f"Couldn't connect to {positional[0]}:{opts.get('p', 18515)}\n"
                "Unable to open file descriptor for socket connection Unable to init the socket connection\n")
        return 1
    patches = ctx.bench.ocs_patches()
    peer = (next((m for m in candidates if patches.get(me.ocs_tx) == m.ocs_rx), None)
            or next((m for m in candidates if m.rdma_dev == me.rdma_dev), None) or candidates[0])
    rate = plane.pair_bytes_s(me, peer)
    spans = plane.run(me, [[(peer, float(size * iters), 0.0)]])
    if spans is None:
        return 1
    measured = (spans[0][1] - spans[0][0]) / 1e9 * plane.time_scale
    average = size * iters / measured
    gbits = bool(opts.get("gbits"))
    unit = (lambda b: b * 8 / 1e9) if gbits else (lambda b: b / 2**20)  # noqa: E731  perftest's MiB = 2^20
    row = (size, iters, unit(rate), unit(average), average / size / 1e6)
    ctx.out(formats.ib_write_bw_output(me.rdma_dev, _perftest_end(me), _perftest_end(peer), [row],
                                       report_gbits=gbits, qps=qps, mtu=mtu, gid_index=gid_index,
                                       tools=ctx.server.tools))
    return 0


COMMANDS: dict[str, Handler] = {"alltoall_perf": _alltoall_perf, "ib_write_bw": _ib_write_bw,
                                "fabric_link": _fabric_link}
