"""Every SSH connection of a process on one thread: paramiko's own, unchanged `Transport.run` loop of each
connection runs as a greenlet on a hub thread instead of an OS thread of its own, so a pod of hundreds of hosts
costs the harness (and the emulator) one thread for SSH, not one per host.

How, and why it stays paramiko:
- `HubTransport` is a `paramiko.Transport` whose Thread parts (`start`, `is_alive`, `join`) spawn and follow a
  greenlet on the `Hub`; its socket is a `HubSocket`, non-blocking underneath: a `recv`/`send` that would block,
  made in a hub greenlet, registers the descriptor with the hub's selector and switches to the hub, which
  switches back when it is ready — or raises `socket.timeout` at the timeout paramiko set (0.1 s), so its
  keep-alive, `active` and close checks run exactly as on a thread of their own. One read takes what has come
  and paramiko's exact reads (a packet's header, then its rest) are served from it. The same socket called from
  any other thread (a caller's `channel.send`) waits in that thread, as a blocking socket would.
- Callers keep their threads: `open_session`, `Channel.recv`/`send`, auth and channel waits on
  `threading.Event` work unchanged (paramiko's loop sets those events, now from the hub thread).
- A greenlet never blocks the hub on another thread: the two locks paramiko may hold across a socket send
  (the packetizer's write lock, `clear_to_send_lock`) are tried without blocking and waited for on the hub, a
  user message during key exchange waits on the hub, or is held if the connection's own loop sent it (only the
  loop can finish the exchange: `_send_user_message`), and the handshake timeout is a deadline instead of
  paramiko's `threading.Timer` (a thread per connection while it lasts).
Relies on paramiko internals (the packetizer's write lock, `_send_user_message`, `clear_to_send`, `sock._closed`):
the verified versions are pinned in pyproject.toml and held to by tests/test_sshhub.py.
"""
from __future__ import annotations

import atexit
import collections
import errno
import heapq
import hmac
import itertools
import logging
import os
import select
import selectors
import socket
import threading
import time
import weakref

import greenlet
import paramiko
import paramiko.packet
import paramiko.util
from paramiko.buffered_pipe import BufferedPipe
from paramiko.packet import Packetizer

from devices.timing import ClockPair, ReceiveStamps, enable_receive_stamps, now_ns

_log = logging.getLogger(__name__)

# Every packet received is checked against its MAC with paramiko's constant-time comparison, a Python loop
# over the bytes (~5-9 us for a 32-byte MAC, on both ends: hundreds of packets a cycle); the standard library's
# hmac.compare_digest is the same comparison, constant-time, in C (~0.1-0.3 us).
paramiko.util.constant_time_bytes_eq = hmac.compare_digest
# Every packet, sent or received, gets its MAC from paramiko's compute_hmac: a new HMAC keyed per packet (the
# key's two pad blocks hashed again each time). A keyed base per (key, digest), copied per packet, gives the
# same digest without that (~0.3-1.8 us less a packet). Bases are never updated, only copied; a new key (a
# connection, a re-key) adds one, and the table is emptied once it holds _KEYED_MAX.
_KEYED_MAX = 4096
_keyed: dict[tuple[bytes, object], hmac.HMAC] = {}


def _compute_hmac(key: bytes, message: bytes, digest_class) -> bytes:
    base = _keyed.get((key, digest_class))
    if base is None:
        if len(_keyed) >= _KEYED_MAX:
            _keyed.clear()
        base = _keyed[(key, digest_class)] = hmac.HMAC(key, digestmod=digest_class)
    mac = base.copy()
    mac.update(message)
    return mac.digest()


paramiko.packet.compute_hmac = _compute_hmac
_READ_AHEAD = 65536  # bytes a hub socket's read takes at most
_LOCK_RETRY_S = 0.0005  # a lock another thread holds is tried again this often (the hub serves others meanwhile)


class _Waiter:
    __slots__ = ("glet", "done")

    def __init__(self, glet):
        self.glet = glet
        self.done = False


class Hub:
    """One thread, one selector, the greenlets it serves. `spawn` and `call_soon` from any thread; `wait` and
    `sleep` only inside one of its greenlets (`in_greenlet()`)."""

    def __init__(self, name: str = "ssh-hub"):
        self.name = name
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._calls: collections.deque = collections.deque()
        self._timers: list = []  # (due, seq, waiter); a waiter already done is skipped
        self._seq = itertools.count()
        self._main = None
        self.pid = os.getpid()
        self.greenlets = 0  # running now (each a connection's loop)
        self._live: set = set()
        self._stopping = False
        # When the loop last returned from its selector and has since served everything that was ready then: every
        # byte that reached a socket of this hub before it has been taken off and delivered (`caught_up_ns`).
        self.caught_up_ns = now_ns()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=name)
        self._thread.start()
        self._ready.wait()
        _hubs.add(self)

    def stop(self, timeout: float = 2.0) -> None:
        """End every greenlet (GreenletExit at the switch it waits in) and the hub's thread, and wait for it.
        Run at exit for every hub: a greenlet still suspended on a daemon thread when the interpreter
        finalises can crash it (SIGSEGV)."""
        if not self._thread.is_alive() or self.on_thread():
            return
        self.call_soon(self._shutdown)
        self._thread.join(timeout)

    def _shutdown(self) -> None:
        self._stopping = True
        for _ in range(3):  # a greenlet's clean-up may wait again: end it once more
            for glet in list(self._live):
                if not glet.dead:
                    try:
                        glet.throw(greenlet.GreenletExit)
                    except BaseException:  # noqa: BLE001 — stopping regardless
                        pass

    # ---- any thread
    def call_soon(self, fn) -> None:
        """Run `fn()` on the hub thread (outside any greenlet), soon."""
        self._calls.append(fn)
        if threading.get_ident() != self._thread.ident:
            try:
                self._wake_w.send(b"x")
            except BlockingIOError:  # already woken
                pass

    def spawn(self, fn) -> None:
        """Run `fn()` as a greenlet on the hub."""
        self.call_soon(lambda: self._start(fn))

    def on_thread(self) -> bool:
        return threading.get_ident() == self._thread.ident

    def in_greenlet(self) -> bool:
        return threading.get_ident() == self._thread.ident and greenlet.getcurrent() is not self._main

    def close_socket(self, sock: socket.socket) -> None:
        """Close `sock` on the hub thread: whoever waits for it wakes (as at a timeout) and the selector
        forgets it before its descriptor can be reused."""
        if self.on_thread():
            self._close_now(sock)
        else:
            self.call_soon(lambda: self._close_now(sock))

    # ---- inside a greenlet of this hub
    def wait(self, fd: int, events: int, timeout: float | None) -> bool:
        """Switch to the hub until `fd` is ready for `events` (True) or `timeout` seconds pass (False)."""
        if timeout is not None and timeout <= 0:
            return False
        waiter = _Waiter(greenlet.getcurrent())
        try:  # kept registered between waits: with the same events, no system call
            self._selector.modify(fd, events, waiter)
        except KeyError:
            self._selector.register(fd, events, waiter)
        except OSError:  # the number was closed behind the hub's back and reused: watch the new one
            self._selector.unregister(fd)
            self._selector.register(fd, events, waiter)
        if timeout is not None:
            heapq.heappush(self._timers, (time.monotonic() + timeout, next(self._seq), waiter))
        return self._main.switch()

    def sleep(self, seconds: float) -> None:
        waiter = _Waiter(greenlet.getcurrent())
        heapq.heappush(self._timers, (time.monotonic() + seconds, next(self._seq), waiter))
        self._main.switch()

    # ---- the hub thread
    def _start(self, fn) -> None:
        def body():
            self.greenlets += 1
            self._live.add(glet)
            try:
                fn()
            except greenlet.GreenletExit:
                pass
            except BaseException:  # noqa: BLE001 — one connection's end never ends the hub
                _log.exception("%s: a greenlet ended with an exception", self.name)
            finally:
                self._live.discard(glet)
                self.greenlets -= 1

        if self._stopping:
            return
        glet = greenlet.greenlet(body, parent=self._main)
        glet.switch()

    def _fire(self, waiter: _Waiter, ready: bool) -> None:
        if not waiter.done:
            waiter.done = True
            waiter.glet.switch(ready)

    def _forget(self, fd: int, waiter: _Waiter) -> None:
        """Stop watching `fd` if `waiter` still holds it (its greenlet may have closed it, and a new socket
        taken its number, since the selector reported it)."""
        key = self._selector.get_map().get(fd)
        if key is not None and key.data is waiter:
            self._selector.unregister(fd)

    def _close_now(self, sock: socket.socket) -> None:
        try:
            key = self._selector.unregister(sock.fileno())
        except (KeyError, ValueError):
            key = None
        try:
            sock.close()
        except OSError:
            pass
        if key is not None and key.data is not None and not key.data.done:
            # the waiter may be the greenlet now running (it closes its own socket): wake it from the hub
            self.call_soon(lambda: self._fire(key.data, False))

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException:
            _log.critical("%s: its loop died; connections on it are lost", self.name, exc_info=True)
            raise

    def _serve(self) -> None:
        self._main = greenlet.getcurrent()
        self._ready.set()
        select_ = self._selector.select
        timers = self._timers
        while not self._stopping:
            timeout = None
            if self._calls:
                timeout = 0
            else:
                while timers and timers[0][2].done:
                    heapq.heappop(timers)
                if timers:
                    timeout = max(0.0, timers[0][0] - time.monotonic())
            try:
                ready = select_(timeout)
            except OSError:  # a descriptor closed under the selector: the next round has the map without it
                ready = []
            selected_ns = now_ns()
            for key, _ in ready:
                waiter = key.data
                if waiter is None:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except BlockingIOError:
                        pass
                elif waiter.done:  # ready, but nobody waits for it now: stop watching (no spin)
                    self._forget(key.fd, waiter)
                else:
                    self._fire(waiter, True)
            if timers:
                now = time.monotonic()
                while timers and (timers[0][2].done or timers[0][0] <= now):
                    _, _, waiter = heapq.heappop(timers)
                    self._fire(waiter, False)
            for _ in range(len(self._calls)):
                fn = self._calls.popleft()
                try:
                    fn()
                except BaseException:  # noqa: BLE001
                    _log.exception("%s: a call failed", self.name)
            self.caught_up_ns = selected_ns


_hub: Hub | None = None
_hub_lock = threading.Lock()
_hubs: "weakref.WeakSet[Hub]" = weakref.WeakSet()


@atexit.register
def _stop_hubs() -> None:
    for hub in list(_hubs):
        if hub.pid == os.getpid():
            hub.stop()


def shared_hub() -> Hub:
    """The process's one SSH hub (a forked child makes its own: it has no threads; a hub whose loop died is replaced,
    or every later connection would wait for bytes no loop moves)."""
    global _hub
    with _hub_lock:
        if _hub is None or _hub.pid != os.getpid() or not _hub._thread.is_alive():
            _hub = Hub()
        return _hub


class HubSocket:
    """A connected socket for paramiko whose blocking calls wait on the hub when made in one of its greenlets,
    and in the calling thread otherwise; `settimeout` bounds each wait (`socket.timeout`), as on a socket."""

    def __init__(self, sock: socket.socket, hub: Hub, stamps_since: ClockPair | None = None):
        sock.setblocking(False)
        self.sock, self.hub = sock, hub
        # Each read's kernel receive stamp (SO_TIMESTAMPNS, its last segment's): `arrived_ns`, when the bytes read
        # last had surely reached this machine — a clock probe's reply then does not count the hub's backlog.
        # `stamps_since`: taken before the socket connected (the server's banner may come before this exists)
        self._stamps = ReceiveStamps(stamps_since) if enable_receive_stamps(sock) else None
        self.arrived_ns = 0  # harness clock: the upper bound of the last read's stamp (0: none yet, or unstamped)
        self._fd = sock.fileno()
        self._timeout: float | None = None
        self._closed = False  # paramiko reads it (Transport.stop_thread)
        # Bytes read ahead: paramiko asks for a packet's header, then its rest, each a syscall that also lets go
        # of the interpreter lock; one read takes what has come (a cycle's burst: tens of packets).
        self._ahead = b""
        self._at = 0
        self._drained = False  # the last read returned less than it could: nothing more had come
        self.handed = 0  # bytes handed to paramiko so far: after a packet is read, where it ends in the stream
        self.sent = 0  # bytes sent so far (counted with `record_wire` only)
        # `record_wire`: (ns a send began, where its bytes end in the stream) and (ns a chunk was fed, where it
        # ends), for accounting only
        self.wire = _wire_record(sock) if wire is not None else None

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def fileno(self) -> int:
        return -1 if self._closed else self._fd

    def getpeername(self):
        return self.sock.getpeername()

    def getsockname(self):
        return self.sock.getsockname()

    def setsockopt(self, *args) -> None:
        self.sock.setsockopt(*args)

    def _wait(self, events: int) -> bool:
        if self.hub.in_greenlet():
            return self.hub.wait(self._fd, events, self._timeout)
        poller = select.poll()  # not select(): a pod's descriptors pass FD_SETSIZE
        poller.register(self._fd, select.POLLIN if events == selectors.EVENT_READ else select.POLLOUT)
        return bool(poller.poll(None if self._timeout is None else self._timeout * 1000))

    def _nonblocking(self, call, arg, events: int):
        """`call(arg)` on the non-blocking socket, waiting (see `_wait`) while it would block."""
        while True:
            if self._closed:
                raise OSError(errno.EBADF, "socket closed")
            try:
                return call(arg)
            except (BlockingIOError, InterruptedError):
                pass
            if not self._wait(events):
                raise socket.timeout("timed out")

    def recv(self, n: int) -> bytes:
        """Up to `n` bytes: from those read ahead, else from one read of what has come (up to _READ_AHEAD)."""
        ahead, at = self._ahead, self._at
        if at == len(ahead):
            # the last read took all there was: on the hub, wait for more first (its one select watches every
            # socket) rather than find out with a read that would block, a system call more
            if self._drained and self.hub.in_greenlet() and not self._wait(selectors.EVENT_READ):
                raise socket.timeout("timed out")
            if self._stamps is not None:
                ahead = self._nonblocking(self._stamped_recv, _READ_AHEAD, selectors.EVENT_READ)
            else:
                ahead = self._nonblocking(self.sock.recv, _READ_AHEAD, selectors.EVENT_READ)
            self._drained = len(ahead) < _READ_AHEAD
            if len(ahead) <= n:  # all of it (b"": the peer closed)
                self._ahead, self._at = b"", 0
                self.handed += len(ahead)
                return ahead
            at = 0
        data = ahead[at:at + n]
        self._ahead, self._at = ahead, at + len(data)
        self.handed += len(data)
        return data

    def stamp_report(self) -> tuple[bool, int, str]:
        """(reads are kernel-stamped, how many fell back to the read time, the last fallback's reason)."""
        if self._stamps is None:
            return False, 0, "the socket does not give kernel receive stamps"
        return True, self._stamps.fallbacks, self._stamps.reason

    def _stamped_recv(self, n: int) -> bytes:
        got = self._stamps.recv(self.sock, n)
        self.arrived_ns = got.t_ns + got.bound_ns  # a fallback's read time bounds it too
        return got.data

    def send(self, data) -> int:
        if _first_send.armed and not _first_send.ns:
            _first_send.ns = now_ns()
        if self.wire is None:
            return self._nonblocking(self.sock.send, data, selectors.EVENT_WRITE)
        began = now_ns()
        sent = self._nonblocking(self.sock.send, data, selectors.EVENT_WRITE)
        self.sent += sent
        self.wire["sent"].append((began, self.sent))
        return sent

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.hub.close_socket(self.sock)


class ArrivalStampedPipe(BufferedPipe):
    """A channel's input buffer that stamps each chunk (CLOCK_MONOTONIC ns) when the transport's loop feeds it,
    i.e. on the hub right after the packet left the socket and was decrypted, not when a reader thread gets
    the GIL to read it (0.1-3 ms later on a busy process). After `read`, `last_read_ns` is that stamp of the
    last byte returned, and `last_arrival_ns` the earlier bound the socket's kernel receive stamp gives (the
    packet had reached the machine by then; the hub may have been busy with other packets until it was fed):
    what a clock probe's reply time needs, where the hub's backlog would lengthen only the return leg. Pushed
    chunks (`push_to`) carry the feed stamp. One reader thread per channel (its `recv`); feeds come from the
    loop only."""

    def __init__(self, sock: "HubSocket | None" = None):
        super().__init__()
        # the socket whose `arrived_ns` bounds a chunk's arrival (None: the feed stamp does); with `record_wire`,
        # its `wire` lists the feeds
        self._sock = sock
        # (bytes fed in total after the chunk, its feed ns, its arrival bound ns)
        self._marks: collections.deque = collections.deque()
        self._fed = 0
        self._consumed = 0
        self.last_read_ns = self.last_arrival_ns = 0
        self._push = None  # (on_data, on_close) once `push_to`

    def feed(self, data) -> None:
        stamp = now_ns()
        sock = self._sock
        if sock is not None and sock.wire is not None:
            sock.wire["fed"].append((stamp, sock.handed))  # the packet just read ends there
        with self._lock:
            if self._push is not None:
                self._push[0](data, stamp)
                return
            # the mark goes in first: a reader that sees the bytes always finds their stamp. The packet just read
            # ends in the socket's last read, whose kernel stamp (if any, and consistent) is no later than now.
            arrived = sock.arrived_ns if sock is not None else 0
            self._marks.append((self._fed + len(data), stamp, arrived if 0 < arrived <= stamp else stamp))
            self._fed += len(data)
            if self._event is not None:
                self._event.set()
            self._buffer_frombytes(data)
            self._cv.notify_all()

    def push_to(self, on_data, on_close) -> None:
        """From now on hand each chunk to `on_data(data, arrival_ns)` as the transport's loop feeds it, instead
        of buffering it for a reader (no thread woken, no pipe written per packet); what is buffered goes first,
        stamped with its last byte's arrival. Deliveries are serialised (under the pipe's lock: `on_data` must not
        call into the channel). The pipe's close (EOF, the channel's or the connection's end) then calls
        `on_close()`, possibly under the channel's lock. `push_to(None, None)`: nothing more is delivered."""
        with self._lock:
            if on_data is not None and len(self._buffer):
                on_data(self._buffer_tobytes(), self._marks[-1][1] if self._marks else now_ns())
                del self._buffer[:]
                self._consumed = self._fed
                self._marks.clear()
            self._push = None if on_data is None else (on_data, on_close)
            closed = self._closed
        if closed and on_close is not None:
            on_close()

    def close(self) -> None:
        with self._lock:  # BufferedPipe.close, and whether to tell a push target (exactly once: see push_to)
            self._closed = True
            self._cv.notify_all()
            if self._event is not None:
                self._event.set()
            push = self._push
        if push is not None:
            push[1]()

    def read(self, nbytes: int, timeout: float | None = None) -> bytes:
        data = super().read(nbytes, timeout)
        if data:
            self._consumed += len(data)
            marks = self._marks
            while marks[0][0] < self._consumed:
                marks.popleft()
            _, self.last_read_ns, self.last_arrival_ns = marks[0]
        return data


def stamp_arrivals(channel: paramiko.Channel) -> ArrivalStampedPipe:
    """Give `channel` an `ArrivalStampedPipe` input buffer; call before the peer can send (before
    `exec_command`, or in the server's exec request)."""
    sock = getattr(channel.get_transport(), "sock", None)
    pipe = ArrivalStampedPipe(sock if isinstance(sock, HubSocket) else None)
    channel.in_buffer = pipe
    return pipe


# Every hub socket's traffic, by (its local port, its peer's port), for accounting only: None (the default) until
# `record_wire`; nothing in the harness reads it.
wire: dict[tuple[int, int], dict[str, list[tuple[int, int]]]] | None = None


def record_wire() -> dict[tuple[int, int], dict[str, list[tuple[int, int]]]]:
    """From now on, every hub socket of this process lists, by (local port, peer port): "sent", per send, when it
    began (now_ns) and where its bytes end in the stream; "fed", per chunk its channels' stamped pipes were fed
    (one SSH packet each), the stamp and where the packet ends. A packet's bytes cannot reach the other end
    before the peer's send of its last byte began: with both ends' lists (an emulator's, `harness emulate
    --wire-out`), benchmarks/timestamp_accuracy.py splits a line's delivery there, whatever the reader's reads
    took at once. A send costs one append, a feed one."""
    global wire
    if wire is None:
        wire = {}
    return wire


def _wire_record(sock: socket.socket) -> dict[str, list[tuple[int, int]]] | None:
    try:
        key = (sock.getsockname()[1], sock.getpeername()[1])
    except (OSError, IndexError, TypeError):  # not an IP socket (a socketpair): nothing to pair it with
        return None
    return wire.setdefault(key, {"sent": [], "fed": []})


class _FirstSend(threading.local):
    armed = False
    ns = 0


_first_send = _FirstSend()


def first_send_ns(send) -> int:
    """Call `send()` (e.g. a channel's `sendall`, from a caller thread); return when its first socket send on a
    `HubSocket` began (0 if it made none): the earliest the peer can have had the bytes, unlike a stamp taken
    before `send()`, which also counts the channel's locks, the encryption and any wait for the GIL."""
    _first_send.armed, _first_send.ns = True, 0
    try:
        send()
        return _first_send.ns
    finally:
        _first_send.armed = False


class HubLock:
    """A lock that a hub greenlet takes without blocking the hub: tried, and waited for on the hub while
    another thread holds it (from any other thread: the lock's own blocking acquire)."""

    def __init__(self, lock, hub: Hub):
        self._lock, self._hub = lock, hub

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not blocking or not self._hub.in_greenlet():
            return self._lock.acquire(blocking, timeout)
        give_up = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while not self._lock.acquire(False):
            if give_up is not None and time.monotonic() >= give_up:
                return False
            self._hub.sleep(_LOCK_RETRY_S)
        return True

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class HubPacketizer(Packetizer):
    """paramiko's Packetizer with a hub-aware write lock and a handshake deadline instead of a Timer thread."""

    def __init__(self, sock: HubSocket):
        super().__init__(sock)
        self._Packetizer__write_lock = HubLock(threading.RLock(), sock.hub)
        self._handshake_due: float | None = None
        self._handshake_done = False

    def start_handshake(self, timeout: float) -> None:
        if self._handshake_due is None:
            self._handshake_due = time.monotonic() + float(timeout)

    def handshake_timed_out(self) -> bool:
        return (self._handshake_due is not None and not self._handshake_done
                and time.monotonic() >= self._handshake_due)

    def complete_handshake(self) -> None:
        if self._handshake_due is not None:
            self._handshake_done = True


class HubTransport(paramiko.Transport):
    """A paramiko Transport whose loop runs as a greenlet on `hub` (default: the process's shared hub)."""

    # AES-GCM first (OpenSSH has it since 6.2; with a server without it, paramiko's order follows): one AEAD
    # call a packet where AES-CTR takes two cipher updates and an HMAC in Python (~0.5 against ~1.5 us, at
    # both ends). The client's order decides, and a paramiko server follows it.
    _preferred_ciphers = tuple(sorted(paramiko.Transport._preferred_ciphers, key=lambda name: "-gcm@" not in name))

    def __init__(self, sock: socket.socket, *args, hub: Hub | None = None, stamps_since: ClockPair | None = None,
                 **kwargs):
        hub = hub or shared_hub()
        self._hub = hub
        self._loop_started = False
        self._loop_done = threading.Event()
        self._loop_greenlet = None
        self._held: collections.deque = collections.deque()  # the loop's own user messages, held during a key exchange
        # a HubSocket already (a route's: a jump host's channel, a proxy command) is used as it is
        sock = sock if isinstance(sock, HubSocket) else HubSocket(sock, hub, stamps_since)
        super().__init__(sock, *args, packetizer_class=HubPacketizer, **kwargs)
        self.clear_to_send_lock = HubLock(self.clear_to_send_lock, hub)

    # Thread parts: a greenlet, not a thread
    def start(self) -> None:
        self._loop_started = True
        self._hub.spawn(self._run_loop)

    def _run_loop(self) -> None:
        self._loop_greenlet = greenlet.getcurrent()
        try:
            self.run()
        finally:
            self._loop_done.set()

    def is_alive(self) -> bool:
        return self._loop_started and not self._loop_done.is_set()

    def join(self, timeout: float | None = None) -> None:
        if not self._hub.on_thread():  # on the hub, waiting for a greenlet would stop it: never
            self._loop_done.wait(timeout)

    def renegotiate_keys(self) -> None:
        """As paramiko's, but returns only once user messages may flow again. paramiko wakes the caller (its
        completion event) before its loop lets them through (`clear_to_send`) and leaves `in_kex`: an exchange
        asked for in that gap has its hold on user messages undone, so a channel opened meanwhile goes out in
        the middle of the exchange and the peer drops the connection (MessageOrderError)."""
        super().renegotiate_keys()
        while not self.clear_to_send.wait(0.1):
            if not self.active:
                raise self.get_exception() or paramiko.SSHException("Negotiation failed.")

    def _send_user_message(self, data) -> None:
        """As paramiko's (wait while keys are exchanged, drop the message once inactive), with the wait on the
        hub for a greenlet. The connection's own loop never waits: only it can finish the exchange, so its
        messages (the answer to a channel the peer closed, a keep-alive) are held, in order, and sent once the
        exchange is over. paramiko waits in its loop and reads nothing more until the wait times out and the
        connection is lost (its issue 822)."""
        if not self._hub.in_greenlet():
            return super()._send_user_message(data)
        if greenlet.getcurrent() is not self._loop_greenlet:
            return self._send_when_clear(collections.deque([data]))
        with self.clear_to_send_lock:
            if self.clear_to_send.is_set() and not self._held:
                self._send_message(data)
                return
            self._held.append(data)
            if len(self._held) > 1:  # a greenlet waits to send them already
                return
        self._hub.spawn(self._send_held)

    def _send_held(self) -> None:
        try:
            self._send_when_clear(self._held)
        except paramiko.SSHException as exc:  # as paramiko's loop would have ended on it
            self.saved_exception = exc
            self.close()

    def _send_when_clear(self, messages: collections.deque) -> None:
        """Send `messages` in order once user messages may flow, waiting on the hub; dropped once inactive."""
        give_up = time.monotonic() + self.clear_to_send_timeout
        while True:
            if not self.active:
                messages.clear()
                return
            with self.clear_to_send_lock:
                if self.clear_to_send.is_set():
                    while messages:
                        self._send_message(messages.popleft())
                    return
            if time.monotonic() > give_up:
                messages.clear()
                raise paramiko.SSHException("Key-exchange timed out waiting for key negotiation")
            self._hub.sleep(0.01)
