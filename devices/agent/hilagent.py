#!/usr/bin/env python3
"""ocs-hil host agent: time responder, local link watcher, RDMA data counters, RoCEv2 probe sender and receiver.

Standard library only (Python >= 3.7, MIN_PYTHON), one file: the harness copies it to each host and runs
`python3 -u hilagent-XXXX.py SUBCOMMAND ...`. The line protocol is in ARCHITECTURE.md ("Host agent
protocol"). Every timestamp printed is this host's CLOCK_REALTIME in ns.
"""
import argparse
import errno
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

# time.monotonic_ns and time.time_ns (3.7); tests/test_agent.py holds this to vermin's reading of the file. A
# RHEL 8 host's python3 is 3.6: say so in one line (the harness's `version` check reads it), not a traceback later.
MIN_PYTHON = (3, 7)
if sys.version_info < MIN_PYTHON:
    sys.stderr.write("hilagent: needs Python %d.%d or newer; %s is %s\n"
                     % (MIN_PYTHON[0], MIN_PYTHON[1], sys.executable, sys.version.split()[0]))
    sys.exit(3)

ETH_P_IP = 0x0800
ETH_HEADER = 14
UDP_HEADER = 8
BTH_SIZE = 12
PROBE_PAYLOAD = 16  # seq u64, tx_ns u64 (network byte order)
ICRC_SIZE = 4
ROCE_V2_PORT = 4791
RC_SEND_ONLY = 0x04
PACKET_OUTGOING = 4
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SPIN_US = 50  # default: busy-wait only the last 50 µs before a probe is due, sleep before that
MAX_CATCH_UP_NS = 1_000_000  # after a stall longer than this, skip missed ticks instead of bursting

_out_lock = threading.Lock()
_last_emit = [0]  # CLOCK_MONOTONIC ns of the last line written (watch: a heartbeat only after a silence)


def emit(line):
    """Write one line (or several, newline-joined) to stdout at once; the reader going away ends the agent."""
    data = (line + "\n").encode()
    with _out_lock:
        try:
            os.write(1, data)
        except BrokenPipeError:
            os._exit(0)
        _last_emit[0] = time.monotonic_ns()


def note(message):
    try:
        sys.stderr.write("hilagent: " + message + "\n")
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass


def stdin_closed_event():
    """An Event set when stdin reaches EOF (the harness closed the channel)."""
    closed = threading.Event()

    def drain():
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        closed.set()

    threading.Thread(target=drain, name="stdin", daemon=True).start()
    return closed


# --------------------------------------------------------------------------------------------- timesrv
def cmd_timesrv(_args):
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            return 0
        token = line.strip()
        if token:
            now = time.time_ns()
            emit(token.decode(errors="replace") + " " + str(now))


# --------------------------------------------------------------------------------------------- watch
class SysfsField:
    """One sysfs attribute kept open and re-read with pread (sysfs regenerates the value at offset 0)."""

    def __init__(self, netdev, name, path, convert, counter_path=None):
        self.netdev, self.name, self.convert = netdev, name, convert
        self.fd = os.open(path, os.O_RDONLY)
        self.value = None
        self.prev_start_ns = 0
        # A kernel counter of this value's changes (carrier_changes; link_downed for the IB state): a change
        # and its revert between two polls leave the value as it was, but not the counter.
        self.counter_fd, self.count = None, None
        if counter_path is not None:
            try:
                self.counter_fd = os.open(counter_path, os.O_RDONLY)
            except OSError:
                pass  # kernels before 3.15: polling alone

    def changes_since_last(self):
        """How often the value changed since the last call (0 without a counter)."""
        if self.counter_fd is None:
            return 0
        try:
            count = int(os.pread(self.counter_fd, 64, 0).decode().strip() or 0)
        except (OSError, ValueError):
            return 0
        delta = 0 if self.count is None else count - self.count
        self.count = count
        if delta < 0 and self.name == "state":
            delta += 256  # link_downed is an 8-bit counter (PortLinkDownedCounter): it wraps
        return max(delta, 0)

    def read(self):
        try:
            raw = os.pread(self.fd, 64, 0)
        except OSError as exc:
            if self.name == "carrier" and exc.errno == errno.EINVAL:
                return "0"  # an admin-down interface has no carrier to report
            raise
        return self.convert(raw.decode(errors="replace").strip())


def _word_after_code(text):
    """`4: ACTIVE` -> `ACTIVE`, `5: LinkUp` -> `LinkUp` (sysfs infiniband port attributes)."""
    return text.split(":", 1)[1].strip() if ":" in text else text


def _lanes_flagged(value):
    """`ethtool -m` lane flags: `None` or `[ Yes, No, ... ]`; any lane flagged counts."""
    return "1" if "Yes" in value else "0"


def parse_module_flags(text):
    """rx_los / rx_lol from `ethtool -m` output (`\\t%-41s : value` records), and a CMIS module's state
    (ethtool cmis.c: `Module State : 0x03 (ModuleReady)`) as module_state; missing ones are left out."""
    flags = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" : ")
        if not sep:
            continue
        key = key.strip()
        if key == "Rx loss of signal" and "rx_los" not in flags:
            flags["rx_los"] = _lanes_flagged(value)
        elif key == "Rx loss of lock" and "rx_lol" not in flags:
            flags["rx_lol"] = _lanes_flagged(value)
        elif key == "Module State" and "module_state" not in flags:
            word = value.strip().rpartition("(")[2].rstrip(")").strip()
            if word:
                flags["module_state"] = word
    return flags


def parse_watch_spec(spec):
    netdev, _, rdma = spec.partition("=")
    if not netdev or "/" in netdev:
        raise argparse.ArgumentTypeError("expected NETDEV or NETDEV=RDMADEV/PORT, got %r" % spec)
    if not rdma:
        return netdev, None, None
    dev, sep, port = rdma.partition("/")
    if not dev or not sep or not port.isdigit():
        raise argparse.ArgumentTypeError("expected NETDEV=RDMADEV/PORT, got %r" % spec)
    return netdev, dev, int(port)


def open_fields(specs):
    fields = []
    for netdev, rdma_dev, rdma_port in specs:
        sources = [("carrier", "/sys/class/net/%s/carrier" % netdev, str,
                    "/sys/class/net/%s/carrier_changes" % netdev),
                   ("operstate", "/sys/class/net/%s/operstate" % netdev, str, None)]
        if rdma_dev is not None:
            base = "/sys/class/infiniband/%s/ports/%d/" % (rdma_dev, rdma_port)
            sources += [("phys_state", base + "phys_state", _word_after_code, None),
                        ("state", base + "state", _word_after_code, base + "counters/link_downed")]
        for name, path, convert, counter in sources:
            try:
                fields.append(SysfsField(netdev, name, path, convert, counter))
            except OSError as exc:
                note("%s: %s unavailable (%s); not watched" % (netdev, name, exc.strerror or exc))
    return fields


def watch_ethtool(netdevs, interval_ns, stop, ethtool="ethtool"):
    """Poll `ethtool -m` per netdev in its own thread, so a slow tool never delays the sysfs polls. `ethtool`:
    the path the inventory declares (a non-root PATH may lack /usr/sbin)."""
    last = {}  # (netdev, field) -> value
    prev_start = {}
    skipped = set()
    t0 = time.monotonic_ns()
    tick = 0
    while not stop.is_set():
        for netdev in netdevs:
            if netdev in skipped:
                continue
            start = time.time_ns()
            try:
                done = subprocess.run([ethtool, "-m", netdev], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, timeout=5)
            except FileNotFoundError:
                note("%s not found; rx_los and rx_lol not watched" % ethtool)
                return
            except subprocess.TimeoutExpired:
                continue
            end = time.time_ns()
            flags = parse_module_flags(done.stdout.decode(errors="replace")) if done.returncode == 0 else {}
            if not flags:
                note("%s: `ethtool -m` gave no module flags (%s); rx_los and rx_lol not watched"
                     % (netdev, done.stderr.decode(errors="replace").strip() or "rc %d" % done.returncode))
                skipped.add(netdev)
                continue
            lines = []  # one write per netdev's read (not per tick: each `ethtool -m` takes milliseconds)
            for name in ("rx_los", "rx_lol", "module_state"):
                if name not in flags:
                    continue
                key = (netdev, name)
                if last.get(key) != flags[name]:
                    interval = end - prev_start[key] if key in prev_start else 0
                    lines.append("%d %s %s %s %d" % (end, netdev, name, flags[name], interval))
                    last[key] = flags[name]
                prev_start[key] = start
            if lines:
                emit("\n".join(lines))
        if len(skipped) == len(netdevs):
            return
        tick = max(tick + 1, (time.monotonic_ns() - t0) // interval_ns + 1)
        if stop.wait(max(0, t0 + tick * interval_ns - time.monotonic_ns()) / 1e9):
            return


def poll_lines(f, value, changes, start, end):
    """The lines one poll of `f` prints: a changed value (and, when carrier_changes moved by three or more, the
    change, its revert and the change again); or — when the value reads as before but its change counter moved
    (carrier_changes by two or more, the IB state's link_downed at all) — the change and its revert, all within
    this poll's interval, so a transition faster than the poll is not lost. Updates f's last value and poll
    start."""
    lines = []
    interval = end - f.prev_start_ns if f.value is not None else 0
    if value != f.value:
        if changes >= 3 and f.value is not None and value in ("0", "1"):
            # changed, and back and forth besides (carrier_changes moved by three or more): the flap in between
            lines += ["%d %s %s %s %d" % (end, f.netdev, f.name, v, interval) for v in (value, f.value, value)]
        else:
            lines.append("%d %s %s %s %d" % (end, f.netdev, f.name, value, interval))
    elif changes >= 2 and value in ("0", "1"):
        other = "0" if value == "1" else "1"
        lines += ["%d %s %s %s %d" % (end, f.netdev, f.name, v, interval) for v in (other, value)]
    elif changes >= 1 and f.name == "state" and value == "ACTIVE":  # the link went down and trained again
        lines += ["%d %s %s %s %d" % (end, f.netdev, f.name, v, interval) for v in ("DOWN", value)]
    f.value, f.prev_start_ns = value, start
    return lines


def cmd_watch(args):
    if args.interval_us <= 0:
        raise SystemExit("watch: --interval-us must be > 0")
    stop = stdin_closed_event()
    fields = open_fields(args.ports)
    if args.ethtool_interval_us > 0:
        netdevs = [spec[0] for spec in args.ports]
        threading.Thread(target=watch_ethtool, args=(netdevs, args.ethtool_interval_us * 1000, stop, args.ethtool),
                         name="ethtool", daemon=True).start()
    interval_ns = args.interval_us * 1000
    # A tick that finds the stream silent for a heartbeat period prints `HOST_NS alive`: the harness tells a quiet
    # port from a stalled agent by it (no extra line while changes flow).
    heartbeat_ns = max(0, args.heartbeat_us) * 1000
    failed = set()
    t0 = time.monotonic_ns()
    _last_emit[0] = t0
    tick = 0
    while True:
        # A tick's lines leave in one write: one SSH packet per host and tick, not one per line (each line is
        # stamped at its own read, so only their delivery waits for the tick's last read, a few µs a field).
        lines = []
        for f in fields:
            start = time.time_ns()
            try:
                value = f.read()
            except OSError as exc:
                if f not in failed:
                    note("%s: reading %s failed (%s); keeping the last value" % (f.netdev, f.name, exc))
                    failed.add(f)
                continue
            end = time.time_ns()
            lines += poll_lines(f, value, f.changes_since_last(), start, end)
        if lines:
            emit("\n".join(lines))
        if heartbeat_ns and time.monotonic_ns() - _last_emit[0] >= heartbeat_ns:
            emit("%d alive" % time.time_ns())
        # Absolute deadlines: ticks never drift; after a stall we skip to the next future tick.
        tick = max(tick + 1, (time.monotonic_ns() - t0) // interval_ns + 1)
        if stop.wait(max(0, t0 + tick * interval_ns - time.monotonic_ns()) / 1e9):
            return 0


# --------------------------------------------------------------------------------------------- counters
def parse_counter_spec(spec):
    dev, sep, port = spec.partition("/")
    if not sep or not dev or not port.isdigit():
        raise argparse.ArgumentTypeError("expected RDMADEV/PORT, got %r" % spec)
    return dev, port


def open_counters(ports, root="/sys/class/infiniband"):
    """(name, xmit fd, rcv fd) per (dev, port); a port without the counters stops the agent with its name."""
    files = []
    for dev, port in ports:
        base = "%s/%s/ports/%s/counters/" % (root, dev, port)
        try:
            files.append(("%s/%s" % (dev, port), os.open(base + "port_xmit_data", os.O_RDONLY),
                          os.open(base + "port_rcv_data", os.O_RDONLY)))
        except OSError as exc:
            raise SystemExit("counters: %s/%s: %s" % (dev, port, exc))
    return files


def sample_counters(files):
    """One line per port: `HOST_NS RDMADEV/PORT XMIT RCV READ_NS` (read within [HOST_NS-READ_NS, HOST_NS])."""
    lines = []
    for name, xmit, rcv in files:
        start = time.time_ns()
        x, r = os.pread(xmit, 64, 0), os.pread(rcv, 64, 0)
        end = time.time_ns()
        lines.append("%d %s %s %s %d" % (end, name, x.decode().strip(), r.decode().strip(), end - start))
    return lines


def cmd_counters(args):
    """Every interval, each port's RDMA data counters (port_xmit_data, port_rcv_data: octets / 4)."""
    if args.interval_us <= 0:
        raise SystemExit("counters: --interval-us must be > 0")
    stop = stdin_closed_event()
    files = open_counters(args.ports)
    interval_ns = args.interval_us * 1000
    t0 = time.monotonic_ns()
    tick = 0
    while True:
        emit("\n".join(sample_counters(files)))
        tick = max(tick + 1, (time.monotonic_ns() - t0) // interval_ns + 1)  # absolute ticks, as in watch
        if stop.wait(max(0, t0 + tick * interval_ns - time.monotonic_ns()) / 1e9):
            return 0


# --------------------------------------------------------------------------------------------- probes
def mac_bytes(mac):
    parts = mac.split(":")
    if len(parts) != 6:
        raise ValueError("bad MAC address %r" % mac)
    return bytes(int(p, 16) for p in parts)


def mac_text(raw):
    return ":".join("%02x" % b for b in raw)


def ipv4_checksum(header):
    total = sum(struct.unpack("!%dH" % (len(header) // 2), header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return (~total) & 0xFFFF


def build_probe_frame(src_mac, dst_mac, src_ip, dst_ip, udp_port=ROCE_V2_PORT, dqpn=1, psn=0,
                      payload=b"\0" * PROBE_PAYLOAD, udp_sport=49152):
    """Ether / IPv4 / UDP (checksum 0) / BTH (RC SEND_ONLY) / payload / ICRC, without scapy."""
    udp_len = UDP_HEADER + BTH_SIZE + len(payload) + ICRC_SIZE
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 1, 0, 64, 17, 0,
                               socket.inet_aton(src_ip), socket.inet_aton(dst_ip)))
    struct.pack_into("!H", ip, 10, ipv4_checksum(bytes(ip)))
    udp = struct.pack("!HHHH", udp_sport, udp_port, udp_len, 0)
    bth = struct.pack("!BBHI", RC_SEND_ONLY, 0, 0xFFFF, dqpn & 0xFFFFFF) + struct.pack("!I", psn & 0xFFFFFF)
    frame = mac_bytes(dst_mac) + mac_bytes(src_mac) + struct.pack("!H", ETH_P_IP) + bytes(ip) + udp + bth + payload
    layout = ProbeLayout(frame + b"\0" * ICRC_SIZE)
    return layout.frame(psn, payload)


class ProbeLayout:
    """Offsets in a RoCEv2 probe template, and the ICRC state up to the PSN.

    RoCEv2 ICRC = CRC-32 over 8 bytes of 0xFF (stand-in LRH), the IPv4 header with TOS, TTL and checksum
    set to all ones, the UDP header with its checksum set to all ones, the BTH with its FECN/BECN/reserved
    byte set to all ones, and the payload; it is sent least significant byte first. Everything before the
    PSN is constant, so its CRC is computed once and continued per packet with zlib.crc32(data, value).
    """

    def __init__(self, template):
        if len(template) < ETH_HEADER + 20 or struct.unpack_from("!H", template, 12)[0] != ETH_P_IP:
            raise ValueError("probe template must be an Ethernet/IPv4 frame")
        ihl = (template[ETH_HEADER] & 0x0F) * 4
        self.udp = ETH_HEADER + ihl
        self.bth = self.udp + UDP_HEADER
        self.psn = self.bth + 9
        self.payload = self.bth + BTH_SIZE
        self.icrc = self.payload + PROBE_PAYLOAD
        if template[ETH_HEADER + 9] != 17 or len(template) != self.icrc + ICRC_SIZE:
            raise ValueError("probe template must be Ether/IPv4/UDP/BTH/16-byte payload/ICRC (%d bytes), got %d"
                             % (self.icrc + ICRC_SIZE, len(template)))
        self.template = bytes(template)
        ip = bytearray(template[ETH_HEADER:self.udp])
        ip[1] = 0xFF  # TOS
        ip[8] = 0xFF  # TTL
        ip[10:12] = b"\xff\xff"  # header checksum
        udp = bytearray(template[self.udp:self.bth])
        udp[6:8] = b"\xff\xff"  # UDP checksum
        bth = bytearray(template[self.bth:self.psn])
        bth[4] = 0xFF  # FECN, BECN, reserved
        self.prefix_crc = zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(bth))

    def patch(self, buf, psn, payload):
        """Write PSN, payload and ICRC into `buf` (a bytearray copy of the template)."""
        variable = struct.pack("!I", psn & 0xFFFFFF)[1:] + payload
        buf[self.psn:self.icrc] = variable
        struct.pack_into("<I", buf, self.icrc, zlib.crc32(variable, self.prefix_crc))

    def frame(self, psn, payload):
        buf = bytearray(self.template)
        self.patch(buf, psn, payload)
        return bytes(buf)


def interface_ipv4(iface):
    """The interface's IPv4 address, or 0.0.0.0 when it has none."""
    import fcntl  # Unix only; imported here so the module still imports elsewhere

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            ifreq = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", iface.encode()[:15]))
        except OSError:
            return "0.0.0.0"
    return socket.inet_ntoa(ifreq[20:24])


def probe_templates_from_args(args):
    """One frame template per --iface, in order: each its --template, or (one port only) built from --dst-mac."""
    if args.template:
        if len(args.template) != len(args.iface):
            raise SystemExit("probe-send: give one --template per --iface (%d ports, %d templates)"
                             % (len(args.iface), len(args.template)))
        try:
            return [bytes.fromhex(t) for t in args.template]
        except ValueError:
            raise SystemExit("probe-send: --template must be hex") from None
    if not args.dst_mac:
        raise SystemExit("probe-send: give --template HEX or --dst-mac MAC")
    if len(args.iface) != 1:
        raise SystemExit("probe-send: --dst-mac builds the frame of one --iface; give a --template per port")
    iface = args.iface[0]
    with open("/sys/class/net/%s/address" % iface) as f:
        src_mac = f.read().strip()
    src_ip = interface_ipv4(iface)
    return [build_probe_frame(src_mac, args.dst_mac, src_ip, args.dst_ip or src_ip, args.udp_port, args.dqpn)]


def port_socket(iface, protocol):
    """A raw packet socket on `iface` alone, for `protocol` (an Ethernet type; 0: none). It is opened with
    protocol 0 and given `protocol` only in its bind: opened for a protocol, it would hear every port of the
    namespace until bound."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    sock.bind((iface, protocol))
    return sock


def cmd_probe_send(args):
    if args.interval_us <= 0:
        raise SystemExit("probe-send: --interval-us must be > 0")
    if len(set(args.iface)) != len(args.iface):
        raise SystemExit("probe-send: an --iface given twice")
    try:
        layouts = [ProbeLayout(t) for t in probe_templates_from_args(args)]
    except ValueError as exc:
        raise SystemExit("probe-send: %s" % exc) from None
    # one process for all of a host's ports: each port's probe leaves on every tick, its own sequence in each
    # (a process and an SSH session per port would pass sshd's MaxSessions, 10 by default, on an 8-NIC host)
    ports = [(layout.patch, bytearray(layout.template), port_socket(iface, 0).send)  # protocol 0: hears nothing
             for iface, layout in zip(args.iface, layouts)]
    stop = stdin_closed_event()
    interval = args.interval_us * 1000
    spin_ns = args.spin_us * 1000
    ignored = (errno.ENOBUFS, errno.ENETDOWN, errno.EAGAIN)  # carrier down: the kernel refuses, we go on
    sent, errors = [0] * len(ports), [0] * len(ports)
    skipped = 0
    monotonic_ns, time_ns, pack = time.monotonic_ns, time.time_ns, struct.pack
    t0 = monotonic_ns()
    seq = 0
    while not stop.is_set():
        due = t0 + seq * interval
        remaining = due - monotonic_ns()
        if remaining > spin_ns:
            time.sleep((remaining - spin_ns) / 1e9)
        while monotonic_ns() < due:
            pass
        for i, (patch, buf, send) in enumerate(ports):
            patch(buf, seq, pack("!QQ", seq, time_ns()))
            try:
                send(buf)
                sent[i] += 1
            except OSError as exc:
                if exc.errno not in ignored:
                    raise
                errors[i] += 1
        seq += 1
        late = monotonic_ns() - (t0 + seq * interval)
        if late > MAX_CATCH_UP_NS:
            missed = late // interval + 1
            skipped += missed
            seq += missed
    if skipped:
        note("probe-send: skipped %d ticks after stalls longer than %d us" % (skipped, MAX_CATCH_UP_NS // 1000))
    if len(ports) == 1:
        emit("sent %d errors %d" % (sent[0], errors[0]))
    else:
        emit("\n".join("sent %d errors %d %s" % (n, e, iface) for n, e, iface in zip(sent, errors, args.iface)))
    return 0


class ProbeParser:
    """Pull (src_mac, seq) out of a received frame, or None when it is not one of our probes."""

    def __init__(self, udp_port):
        self.udp_port = udp_port

    def __call__(self, data):
        if len(data) < ETH_HEADER + 20 or data[12] != 0x08 or data[13] != 0x00:
            return None
        ihl = (data[ETH_HEADER] & 0x0F) * 4
        if data[ETH_HEADER + 9] != 17:
            return None
        udp = ETH_HEADER + ihl
        payload = udp + UDP_HEADER + BTH_SIZE
        if len(data) < payload + 8 or struct.unpack_from("!H", data, udp + 2)[0] != self.udp_port:
            return None
        return mac_text(data[6:12]), struct.unpack_from("!Q", data, payload)[0]


def kernel_rx_ns(ancdata):
    for level, kind, value in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(value) >= 16:
            sec, nsec = struct.unpack_from("@qq", value)
            return sec * 1_000_000_000 + nsec
    return time.time_ns()


def cmd_probe_recv(args):
    if args.gap_us <= 0:
        raise SystemExit("probe-recv: --gap-us must be > 0")
    if len(set(args.iface)) != len(args.iface):
        raise SystemExit("probe-recv: an --iface given twice")
    gap = args.gap_us * 1000
    named = len(args.iface) > 1  # over several ports each line ends with its port's name
    port_of = {}  # socket -> its port's name
    for iface in args.iface:
        sock = port_socket(iface, ETH_P_IP)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.setblocking(False)
        port_of[sock] = iface
    parse = ProbeParser(args.udp_port)
    cmsg_size = socket.CMSG_SPACE(16)
    last = {}  # (socket, src_mac) -> (kernel rx ns, seq) of the newest probe of a running stream
    stdin_fd = 0
    watch = list(port_of) + [stdin_fd]

    def line(sock, rx_ns, kind, mac, seq):
        text = "%d %s %s %d" % (rx_ns, kind, mac, seq)
        return text + " " + port_of[sock] if named else text

    def receive_pending(sock, out):
        while True:
            try:
                data, anc, _flags, addr = sock.recvmsg(2048, cmsg_size)
            except BlockingIOError:
                return
            if addr[2] == PACKET_OUTGOING:
                continue
            probe = parse(data)
            if probe is None:
                continue
            mac, seq = probe
            rx_ns = kernel_rx_ns(anc)
            previous = last.get((sock, mac))
            if previous is not None and rx_ns - previous[0] >= gap:
                out.append(line(sock, previous[0], "last", mac, previous[1]))  # we were slower than the gap
                previous = None
            if previous is None:
                out.append(line(sock, rx_ns, "first", mac, seq))
            last[(sock, mac)] = (rx_ns, seq)

    while True:
        timeout = None
        if last:
            timeout = max(0, min(t for t, _ in last.values()) + gap - time.time_ns()) / 1e9
        readable, _, _ = select.select(watch, [], [], timeout)
        if stdin_fd in readable and not os.read(stdin_fd, 4096):
            return 0
        out = []
        for sock in readable:
            if sock in port_of:
                receive_pending(sock, out)
        # Declare a silence only when nothing is queued on that port: a late reader must not invent gaps.
        now = time.time_ns()
        silent = set(sock for (sock, _), (t, _) in last.items() if now - t >= gap)
        if silent:
            queued = select.select(list(silent), [], [], 0)[0]
            for (sock, mac), (t, seq) in list(last.items()):
                if sock in silent and sock not in queued and now - t >= gap:
                    out.append(line(sock, t, "last", mac, seq))
                    del last[(sock, mac)]
        if out:
            emit("\n".join(out))  # what one round received, in one write (a host's ports: one packet)


# --------------------------------------------------------------------------------------------- main
def make_parser():
    parser = argparse.ArgumentParser(prog="hilagent", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    sub.required = True
    sub.add_parser("timesrv", help="answer each stdin line TOKEN with `TOKEN HOST_NS`").set_defaults(
        func=cmd_timesrv)
    sub.add_parser("version", help="print the Python version running the agent (MAJOR.MINOR.MICRO)").set_defaults(
        func=cmd_version)
    w = sub.add_parser("watch", help="poll link state locally, print changes")
    w.add_argument("--interval-us", type=int, required=True)
    w.add_argument("--ethtool-interval-us", type=int, default=100_000, help="0 disables `ethtool -m` polls")
    w.add_argument("--ethtool", default="ethtool", help="the ethtool to run (an absolute path: the inventory's tools:)")
    w.add_argument("--heartbeat-us", type=int, default=0,
                   help="print `HOST_NS alive` after this long without a line (0: never)")
    w.add_argument("ports", nargs="+", type=parse_watch_spec, metavar="NETDEV[=RDMADEV/PORT]")
    w.set_defaults(func=cmd_watch)
    c = sub.add_parser("counters", help="sample RDMA data counters locally, print every sample")
    c.add_argument("--interval-us", type=int, required=True)
    c.add_argument("ports", nargs="+", type=parse_counter_spec, metavar="RDMADEV/PORT")
    c.set_defaults(func=cmd_counters)
    s = sub.add_parser("probe-send", help="paced RoCEv2 probes from raw sockets until stdin closes")
    s.add_argument("--iface", required=True, action="append",
                   help="a port to send on; several: each with its --template, in the same order")
    s.add_argument("--interval-us", type=int, required=True)
    s.add_argument("--template", action="append",
                   help="hex of a full probe frame (Ether/IPv4/UDP/BTH/payload/ICRC), one per --iface")
    s.add_argument("--dst-mac", help="build the frame of a single --iface here instead of --template")
    s.add_argument("--dst-ip", help="with --dst-mac (default: the interface's address)")
    s.add_argument("--udp-port", type=int, default=ROCE_V2_PORT)
    s.add_argument("--dqpn", type=int, default=1)
    s.add_argument("--spin-us", type=int, default=SPIN_US,
                   help="busy-wait this long before each probe, sleep before that (a sleeping sender can wake "
                        "late on a busy machine)")
    s.set_defaults(func=cmd_probe_send)
    r = sub.add_parser("probe-recv", help="print the first and last probe around each silence")
    r.add_argument("--iface", required=True, action="append",
                   help="a port to receive on; several: each line ends with its port's name")
    r.add_argument("--gap-us", type=int, required=True)
    r.add_argument("--udp-port", type=int, default=ROCE_V2_PORT)
    r.set_defaults(func=cmd_probe_recv)
    return parser


def cmd_version(args):
    emit("%d.%d.%d" % sys.version_info[:3])
    return 0


def main(argv=None):
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
