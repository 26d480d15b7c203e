"""The emulated host's network tools, answered from the bench's NIC state: `ip` (link, monitor, link set),
`rdma link`, `ethtool` and `ethtool -m`, `mlxlink`, `ibstat`, `ibstatus`, `ibv_devinfo`, `ibdev2netdev`."""
from __future__ import annotations

import queue

from devices.emulated import formats
from devices.emulated.host.context import POLL_S, ExecContext, Handler, fake_pid


ETHTOOL_FIELDS = ("rx_los", "rx_lol")
# Read from `ethtool -m` as well, on its grid, but a state, not a latched flag: a CMIS module's "Module State" (the
# data-path state no `ethtool -m` prints, so the agent cannot watch it: it stays in the ground truth only).
ETHTOOL_STATES = ("module_state",)


def _ip(ctx: ExecContext, argv: list[str]) -> int:
    opts = {"ts": False, "oneline": False, "json": False}
    rest = argv[1:]
    if rest in (["-V"], ["-Version"]):
        ctx.out(f"ip utility, iproute2-{ctx.server.tools.iproute2}, libbpf 1.1.0\n")
        return 0
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        if flag in ("-j", "-json"):
            opts["json"] = True
        elif flag in ("-ts", "-tshort"):
            opts["ts"] = True
        elif flag in ("-o", "-oneline"):
            opts["oneline"] = True
        elif flag in ("-d", "-details", "-s", "-stats"):
            pass
        else:
            ctx.err(f'Option "{flag}" is unknown, try "ip -help".\n')
            return 255
    if rest[:1] == ["monitor"] and rest[1:] in ([], ["link"]):
        return _ip_monitor(ctx, opts["ts"], opts["oneline"])
    if rest[:1] in (["link"], ["l"]) and rest[1:2] == ["set"]:
        return _ip_link_set(ctx, [w for w in rest[2:] if w != "dev"])
    if rest[:1] in (["link"], ["l"]):
        words = [w for w in rest[1:] if w not in ("show", "dev")]
        ports = ctx.server.ports_with_state()
        if words:
            ports = [(m, s) for m, s in ports if m.netdev == words[0]]
            if not ports:
                ctx.err(f'Device "{words[0]}" does not exist.\n')
                return 1
        if opts["json"]:
            ctx.out(formats.ip_link_json(ports, include_loopback=not words))
            return 0
        if words:
            text = "".join(formats.ip_link_lines(m, s.carrier, s.operstate, oneline=opts["oneline"], monitor=False,
                                                 admin_up=s.admin_up)
                           for m, s in ports)
        elif opts["oneline"]:
            text = formats.ip_o_link(ports)
        else:
            text = "".join(formats.ip_link_lines(m, s.carrier, s.operstate, oneline=False, monitor=False,
                                                 admin_up=s.admin_up)
                           for m, s in ports)
        ctx.out(text)
        return 0
    ctx.err(f'Object "{rest[0] if rest else ""}" is unknown, try "ip help".\n')
    return 255


def _ip_link_set(ctx: ExecContext, words: list[str]) -> int:
    """`ip link set [dev] NETDEV up|down` (silent on success, as iproute2 is); the physics switches the port."""
    if len(words) != 2 or words[1] not in ("up", "down"):
        ctx.err("emulated host supports 'ip link set [dev] NETDEV up|down' only\n")
        return 255
    model = ctx.server.nic_by_netdev(words[0])
    if model is None:
        ctx.err(f'Cannot find device "{words[0]}"\n')
        return 1
    ctx.bench.set_admin(ctx.host, model.netdev, words[1] == "up")
    return 0


def _ip_monitor(ctx: ExecContext, stamps: bool, oneline: bool) -> int:
    """Stream a link event whenever carrier or operstate changes. Changes of one port at one instant are one
    RTM_NEWLINK, so one event (a carrier loss takes the carrier and the operstate down together). Netlink is
    immediate here: the emulator does not model linkwatch's up-to-1-s batching of carrier-down events."""
    changes: queue.SimpleQueue = queue.SimpleQueue()
    unsubscribe = ctx.bench.subscribe(ctx.host, changes.put)
    try:
        state = {m.netdev: [m, s.carrier, s.operstate] for m, s in ctx.server.ports_with_state()}
        pending: list = []
        while not ctx.gone():
            if pending:
                change = pending.pop(0)
            else:
                try:
                    change = changes.get(timeout=POLL_S)
                except queue.Empty:
                    continue
            batch = [change]
            while True:  # the changes already queued for the same port and instant join this event
                try:
                    more = changes.get_nowait()
                except queue.Empty:
                    break
                if more.netdev == change.netdev and more.t_ns == change.t_ns:
                    batch.append(more)
                else:
                    pending.append(more)
            entry = state.get(change.netdev)
            if entry is None:
                continue
            changed = False
            for item in batch:
                if item.field not in ("carrier", "operstate"):
                    continue
                new = (item.value == "1") if item.field == "carrier" else item.value
                index = 1 if item.field == "carrier" else 2
                if entry[index] != new:
                    entry[index], changed = new, True
            if not changed:
                continue
            host_ns = ctx.bench.host_time(ctx.host, change.t_ns) if stamps else None
            ctx.out(formats.ip_link_lines(entry[0], entry[1], entry[2], oneline=oneline, monitor=True,
                                          host_ns=host_ns))
    finally:
        unsubscribe()
    return 0


def _rdma(ctx: ExecContext, argv: list[str]) -> int:
    words = argv[1:]
    as_json = any(w in ("-j", "-json", "--json") for w in words)
    words = [w for w in words if not w.startswith("-")]
    if words[:1] != ["link"]:
        ctx.err(f'Unknown object "{words[0] if words else ""}"\n')
        return 1
    ports = ctx.server.ports_with_state()
    select = [w for w in words[1:] if w != "show"]
    if select:
        dev, _, port = select[0].partition("/")
        ports = [(m, s) for m, s in ports if m.rdma_dev == dev and (not port or str(m.rdma_port) == port)]
        if not ports:
            ctx.err("Wrong device name\n")
            return 1
    ctx.out(formats.rdma_link(ports, as_json=as_json, tools=ctx.server.tools))
    return 0


def _ethtool(ctx: ExecContext, argv: list[str]) -> int:
    words = argv[1:]
    if words in (["--version"], ["-V"]):
        ctx.out(f"ethtool version {ctx.server.tools.ethtool}\n")
        return 0
    module = bool(words) and words[0] in ("-m", "--dump-module-eeprom", "--module-info")
    priv_flags = bool(words) and words[0] == "--show-priv-flags"
    if module or priv_flags:
        words = words[1:]
    if len(words) != 1:
        ctx.err("ethtool: bad command line argument(s)\nFor more information run ethtool -h\n")
        return 1
    model = ctx.server.nic_by_netdev(words[0])
    if model is None:
        ctx.err("netlink error: no device matches name (offset 24)\nnetlink error: No such device\n")
        return 1
    if priv_flags:
        ctx.out(formats.ethtool_priv_flags(model.netdev))
        return 0
    snapshot = ctx.bench.nic_snapshot(ctx.host, model.netdev)
    if module:
        los, lol = ctx.server.take_latched(model.netdev)
        ctx.out(formats.ethtool_module(snapshot, rx_los=los or snapshot.rx_los, rx_lol=lol or snapshot.rx_lol,
                                       tools=ctx.server.tools))
    else:
        ctx.out(formats.ethtool(model, snapshot, tools=ctx.server.tools))
    return 0


def _mlxlink(ctx: ExecContext, argv: list[str]) -> int:
    dev = argv[argv.index("-d") + 1] if "-d" in argv[:-1] else None
    port = int(argv[argv.index("-p") + 1]) if "-p" in argv[:-1] and argv[argv.index("-p") + 1].isdigit() else None
    model = ctx.server.nic_by_rdma(dev, port) if dev else None
    if model is None:
        ctx.err(f"-E- Failed to open device: {dev}\n")
        return 1
    ctx.out(formats.mlxlink(model, ctx.bench.nic_snapshot(ctx.host, model.netdev), ctx.server.tools))
    return 0


def _ibstat(ctx: ExecContext, argv: list[str]) -> int:
    """`ibstat [CA [PORT]]`; an unknown CA ends as ibstat does, with its ibpanic line and exit status 255."""
    ports = ctx.server.ports_with_state()
    if len(argv) > 1:
        chosen = [(m, s) for m, s in ports if m.rdma_dev == argv[1]
                  and (len(argv) < 3 or str(m.rdma_port) == argv[2])]
        if not chosen:
            ctx.err(f"ibpanic: [{fake_pid('ibstat', argv[1])}] main: stat of IB device '{argv[1]}' failed: "
                    "No such file or directory\n")
            return 255
        ports = chosen
    ctx.out(formats.ibstat(ports))
    return 0


def _ibstatus(ctx: ExecContext, argv: list[str]) -> int:
    """`ibstatus [DEV[:PORT]]`."""
    ports = ctx.server.ports_with_state()
    if len(argv) > 1:
        dev, _, port = argv[1].partition(":")
        ports = [(m, s) for m, s in ports if m.rdma_dev == dev and (not port or str(m.rdma_port) == port)]
        if not ports:
            ctx.err(f"stat: cannot stat '/sys/class/infiniband/{dev}': No such file or directory\n")
            return 1
    ctx.out(formats.ibstatus(ports))
    return 0


def _ibv_devinfo(ctx: ExecContext, argv: list[str]) -> int:
    ports = ctx.server.ports_with_state()
    args = argv[1:]
    if args[:1] in (["-d"], ["--ib-dev"]) and len(args) == 2:
        ports = [(m, s) for m, s in ports if m.rdma_dev == args[1]]
        if not ports:
            ctx.err(f"IB device '{args[1]}' wasn't found\n")
            return 255
    elif args:
        ctx.err("emulated ibv_devinfo supports [-d DEV] only\n")
        return 1
    ctx.out(formats.ibv_devinfo(ports))
    return 0


def _ibdev2netdev(ctx: ExecContext, argv: list[str]) -> int:
    ctx.out(formats.ibdev2netdev(ctx.server.ports_with_state()))
    return 0


COMMANDS: dict[str, Handler] = {
    "ip": _ip, "rdma": _rdma, "ethtool": _ethtool, "mlxlink": _mlxlink,
    "ibstat": _ibstat, "ibstatus": _ibstatus, "ibv_devinfo": _ibv_devinfo, "ibdev2netdev": _ibdev2netdev,
}
